"""``mpkit quiz lint|assign|grade|stats|sheet``: argument parsing and printing only.

The work is done in :mod:`mpkit.quiz.lint`, :mod:`mpkit.quiz.instructor` and
:mod:`mpkit.quiz.sheet`; every handler returns the process exit code.
"""
import argparse
import sys

from mpkit.quiz.bank import load_bank
from mpkit.quiz.instructor import grade, stats, write_assignment
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
                            help="write an nbgrader-compatible assignment notebook")
    p.add_argument("--mode", choices=("exam", "drill"), default="exam")
    p.add_argument("--out", required=True, metavar="NOTEBOOK.ipynb")
    p.set_defaults(handler=cmd_assign)

    p = commands.add_parser("grade", parents=[bank, _selection(required=False)],
                            help="grade results JSON files against the bank's answer key")
    p.add_argument("submissions", nargs="+", metavar="SUBMISSION",
                   help="a results JSON file or a folder of them")
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


def cmd_lint(args):
    report = lint(args.bank)
    print(report.format())
    return 0 if report.ok else 1


def cmd_assign(args):
    bank = load_bank(args.bank)
    items = _selected(args, bank)
    out = write_assignment(items, bank, args.out, lang=args.lang, mode=args.mode)
    print(f"wrote {out} ({len(items)} items, mode={args.mode}, lang={args.lang})")
    return 0


def cmd_grade(args):
    bank = load_bank(args.bank)
    items = _selected(args, bank) if (args.items or args.topic) else None
    report = grade(args.submissions, bank, items)
    for message in report.bad:
        print(f"mpkit quiz grade: skipped {message}", file=sys.stderr)
    grades_path, summary_path = report.write(args.out)
    print(f"graded {len(report.summary)} students: wrote {grades_path} and {summary_path}")
    return 1 if report.bad else 0


def cmd_stats(args):
    print(stats(args.grades))
    return 0


def cmd_sheet(args):
    bank = load_bank(args.bank)
    items = _selected(args, bank)
    sheet, key = write_sheet(items, bank, args.out, lang=args.lang)
    print(f"wrote {sheet} (questions, no answers) and {key} (answer key)")
    return 0
