"""``mpkit exercise list|assign``: the exercises and their nbgrader notebooks (parsing and printing only)."""
from mpkit.exercises import EXERCISES
from mpkit.exercises.assignment import write_assignment
from mpkit.i18n import LANGS


def register(subparsers):
    exercise = subparsers.add_parser("exercise", help="build-it-yourself exercises: list, assign (nbgrader)",
                                     description="Exercises where the learner writes each mechanism.")
    commands = exercise.add_subparsers(dest="exercise_command", required=True, metavar="COMMAND")
    p = commands.add_parser("list", help="every exercise with its lab and number of graded cases")
    p.add_argument("--lang", choices=LANGS, default="en")
    p.set_defaults(handler=cmd_list)
    p = commands.add_parser("assign", help="write an nbgrader source notebook with solution regions and hidden tests",
                            description="Write the instructor's notebook (e.g. course/source/ex1/ex1.ipynb): "
                                        "`nbgrader generate_assignment` strips the solutions; autograde gives one "
                                        "point per checker case.")
    p.add_argument("--exercises", required=True, metavar="NAME,NAME",
                   help="comma-separated exercise names (see `mpkit exercise list`)")
    p.add_argument("--out", required=True, metavar="NOTEBOOK.ipynb")
    p.add_argument("--lang", choices=LANGS, default="ko")
    p.set_defaults(handler=cmd_assign)


def cmd_list(args):
    for name, ex in EXERCISES.items():
        print(f"lab {ex.lab}  {name:<22} {len(ex.cases)} cases  {ex.title(args.lang)}")
    return 0


def cmd_assign(args):
    names = [n.strip() for n in args.exercises.split(",") if n.strip()]
    path = write_assignment(names, args.out, args.lang)
    print(f"wrote {path}: {len(names)} exercises, {sum(len(EXERCISES[n].cases) for n in names)} points")
    return 0
