"""``mpkit quiz lint|assign|grade|stats|sheet``: argument parsing and printing only.

The work is done in :mod:`mpkit.quiz.lint`, :mod:`mpkit.quiz.assignment`,
:mod:`mpkit.quiz.instructor` and :mod:`mpkit.quiz.sheet`; every handler returns the process exit
code, and a bad argument or file becomes one line ``mpkit quiz <command>: error: ...`` with exit
code 2, never a traceback.
"""
import argparse
import csv
import functools
import sys

from mpkit.quiz.assignment import write_assignment
from mpkit.quiz.bank import load_bank
from mpkit.quiz.instructor import check_output_file, grade, stats
from mpkit.quiz.lint import lint
from mpkit.quiz.sheet import write_sheet
from mpkit.i18n import LANGS


def register(subparsers):
    """Add the ``quiz`` subcommand (with its own subcommands) to the top-level ``mpkit`` parser."""
    quiz = subparsers.add_parser("quiz", help="O/X quiz bank: lint, assign, grade, stats, sheet",
                                 description="Tools for the O/X quiz item bank (quizzes/*.yaml).")
    commands = quiz.add_subparsers(dest="quiz_command", required=True, metavar="COMMAND")
    bank = argparse.ArgumentParser(add_help=False)
    bank.add_argument("--bank", metavar="DIR", help="item bank folder (default: $MPKIT_QUIZ_DIR, else the bank installed with mpkit)")

    p = commands.add_parser("lint", parents=[bank], help="check the item bank; exit 1 on errors")
    p.set_defaults(handler=cmd_lint)

    p = commands.add_parser("assign", parents=[bank, _selection(required=True)],
                            help="write an assignment notebook, graded from the notebook alone",
                            description="Write an assignment notebook. Under <course>/source/<name>/ (nbgrader's "
                                        "layout) it is the instructor's copy with the key in hidden tests, and "
                                        "<course>/nbgrader_config.py gets mpkit's grading preprocessors; "
                                        "anywhere else it is the students' copy, without the key.")
    p.add_argument("--mode", choices=("exam", "drill"), default="exam")
    p.add_argument("--out", required=True, metavar="NOTEBOOK.ipynb")
    p.add_argument("--name", metavar="NAME", help="assignment name (default: the nbgrader assignment folder, "
                                                  "else the notebook's file name)")
    p.add_argument("--with-key", action="store_true", default=None,
                   help="put the key (as nbgrader hidden tests) in a notebook outside nbgrader's layout")
    p.set_defaults(handler=cmd_assign)

    p = commands.add_parser("grade", parents=[bank, _selection(required=False)],
                            help="grade collected results files and notebooks with the bank's key",
                            description="Grade collected answers without nbgrader. Each file's name says who "
                                        "the student is (kim.json, kim.ipynb -> kim); the first answer to an "
                                        "item counts; unreadable files are skipped with the reason.")
    p.add_argument("submissions", nargs="+", metavar="SUBMISSION",
                   help="a results .json file, an assignment .ipynb, or a folder of them")
    p.add_argument("--assignment", metavar="NAME", help="grade only answers given in this assignment")
    p.add_argument("--out", required=True, metavar="GRADES.csv",
                   help="per-answer CSV; a .summary.csv per student is written beside it")
    p.set_defaults(handler=cmd_grade)

    p = commands.add_parser("stats", help="item difficulty and pitfall error rates from a grades CSV")
    p.add_argument("grades", metavar="GRADES.csv")
    p.set_defaults(handler=cmd_stats)

    p = commands.add_parser("sheet", parents=[bank, _selection(required=True)],
                            help="printable question sheet (.html or .md) plus a separate answer key")
    p.add_argument("--out", required=True, metavar="SHEET.html|SHEET.md")
    p.set_defaults(handler=cmd_sheet)
    return quiz


def _selection(required):
    """--items/--topic (one of them), and for assign/sheet --n, --seed, --lang."""
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--items", type=_id_list, metavar="ID,ID,...", help="item ids, comma-separated")
    group.add_argument("--topic", metavar="TOPIC", help="a topic name, or 'all'")
    if required:
        parser.add_argument("--n", type=int, help="use only this many items")
        parser.add_argument("--seed", type=int, help="shuffle the items with this seed before taking --n")
        parser.add_argument("--lang", choices=LANGS, default="ko")
    return parser


def _id_list(text):
    ids = [part.strip() for part in text.split(",") if part.strip()]
    if not ids:
        raise argparse.ArgumentTypeError("give item ids separated by commas, e.g. pp-001,pp-002")
    return ids


def _selected(args, bank):
    return bank.select(args.items or args.topic, n=getattr(args, "n", None),
                       shuffle=getattr(args, "seed", None) is not None, seed=getattr(args, "seed", None))


def _one_line_errors(handler):
    """Bad input (a folder where a file belongs, an unreadable CSV, ...) -> one line and exit 2."""
    @functools.wraps(handler)
    def run(args):
        try:
            return handler(args)
        except (ValueError, OSError, csv.Error) as exc:
            print(f"mpkit quiz {args.quiz_command}: error: {exc}", file=sys.stderr)
            return 2
    return run


@_one_line_errors
def cmd_lint(args):
    report = lint(args.bank)
    print(report.format())
    return 0 if report.ok else 1


@_one_line_errors
def cmd_assign(args):
    bank = load_bank(args.bank)
    items = _selected(args, bank)
    name, key, config = write_assignment(items, bank, args.out, name=args.name, lang=args.lang,
                                         mode=args.mode, key=args.with_key)
    print(f"wrote {args.out}: assignment {name!r}, {len(items)} items, mode={args.mode}, lang={args.lang}, "
          + ("instructor's copy (the key is in hidden tests)" if key else "students' copy (no key)"))
    if config is not None:
        print(f"{config} runs mpkit's grading preprocessors (mpkit.quiz.nbgrader.configure); "
              f"next: nbgrader generate_assignment {name}")
    elif not key:
        print(f"grade the collected notebooks with: mpkit quiz grade FOLDER --items {','.join(i.id for i in items)} "
              f"--assignment {name} --out grades.csv")
    return 0


@_one_line_errors
def cmd_grade(args):
    check_output_file(args.out, "grades.csv")
    bank = load_bank(args.bank)
    items = _selected(args, bank) if (args.items or args.topic) else None
    report = grade(args.submissions, bank, items, assignment=args.assignment)
    for message in report.bad:
        print(f"mpkit quiz grade: skipped {message}", file=sys.stderr)
    for message in report.notes:
        print(f"mpkit quiz grade: note: {message}", file=sys.stderr)
    grades_path, summary_path = report.write(args.out)
    print(f"graded {len(report.summary)} students: wrote {grades_path} and {summary_path}")
    return 1 if report.bad else 0


@_one_line_errors
def cmd_stats(args):
    print(stats(args.grades))
    return 0


@_one_line_errors
def cmd_sheet(args):
    bank = load_bank(args.bank)
    items = _selected(args, bank)
    sheet, key = write_sheet(items, bank, args.out, lang=args.lang)
    print(f"wrote {sheet} (questions, no answers) and {key} (answer key)")
    return 0
