"""``mpkit exercise list|assign``: the arguments (the handlers, ``exercise_command``, import the
exercises and nbformat only when one runs)."""
from mpkit.cli.later import later
from mpkit.i18n import LANGS


def register(subparsers):
    exercise = subparsers.add_parser("exercise", help="build-it-yourself exercises: list, assign (nbgrader)",
                                     description="Exercises where the learner writes each mechanism.")
    commands = exercise.add_subparsers(dest="exercise_command", required=True, metavar="COMMAND")
    p = commands.add_parser("list", help="every exercise with its lab and number of graded cases")
    p.add_argument("--lang", choices=LANGS, default="en")
    p.set_defaults(handler=later("mpkit.cli.exercise_command:cmd_list"))
    p = commands.add_parser("assign", help="write an nbgrader source notebook with solution regions and hidden tests",
                            description="Write the instructor's notebook (e.g. course/source/ex1/ex1.ipynb): "
                                        "`nbgrader generate_assignment` strips the solutions; autograde gives one "
                                        "point per checker case.")
    p.add_argument("--exercises", required=True, metavar="NAME,NAME",
                   help="comma-separated exercise names (see `mpkit exercise list`)")
    p.add_argument("--out", required=True, metavar="NOTEBOOK.ipynb")
    p.add_argument("--lang", choices=LANGS, default="ko")
    p.set_defaults(handler=later("mpkit.cli.exercise_command:cmd_assign"))
