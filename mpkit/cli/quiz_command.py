"""``mpkit quiz``'s handlers: each returns the process exit code, and a bad argument or file
becomes one line ``mpkit quiz <command>: error: ...`` with exit code 2, never a traceback."""
import csv
import functools
import sys

from mpkit.quiz.assignment import write_assignment
from mpkit.quiz.bank import load_bank
from mpkit.quiz.instructor import check_output_file, grade, stats
from mpkit.quiz.lint import lint
from mpkit.quiz.sheet import write_sheet


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
