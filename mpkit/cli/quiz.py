"""``mpkit quiz lint|assign|grade|stats|sheet``: the arguments.

The handlers are in ``quiz_command`` (imported when one runs, so ``--help`` does not load the bank's
widgets); the work is done in :mod:`mpkit.quiz.lint`, :mod:`mpkit.quiz.assignment`,
:mod:`mpkit.quiz.instructor` and :mod:`mpkit.quiz.sheet`.
"""
import argparse

from mpkit.cli.later import later
from mpkit.i18n import LANGS


def register(subparsers):
    """Add the ``quiz`` subcommand (with its own subcommands) to the top-level ``mpkit`` parser."""
    quiz = subparsers.add_parser("quiz", help="O/X quiz bank: lint, assign, grade, stats, sheet",
                                 description="Tools for the O/X quiz item bank (quizzes/*.yaml).")
    commands = quiz.add_subparsers(dest="quiz_command", required=True, metavar="COMMAND")
    bank = argparse.ArgumentParser(add_help=False)
    bank.add_argument("--bank", metavar="DIR", help="item bank folder (default: $MPKIT_QUIZ_DIR, else the bank installed with mpkit)")

    p = commands.add_parser("lint", parents=[bank], help="check the item bank; exit 1 on errors")
    p.set_defaults(handler=later("mpkit.cli.quiz_command:cmd_lint"))

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
    p.set_defaults(handler=later("mpkit.cli.quiz_command:cmd_assign"))

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
    p.set_defaults(handler=later("mpkit.cli.quiz_command:cmd_grade"))

    p = commands.add_parser("stats", help="item difficulty and pitfall error rates from a grades CSV")
    p.add_argument("grades", metavar="GRADES.csv")
    p.set_defaults(handler=later("mpkit.cli.quiz_command:cmd_stats"))

    p = commands.add_parser("sheet", parents=[bank, _selection(required=True)],
                            help="printable question sheet (.html or .md) plus a separate answer key")
    p.add_argument("--out", required=True, metavar="SHEET.html|SHEET.md")
    p.set_defaults(handler=later("mpkit.cli.quiz_command:cmd_sheet"))
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
