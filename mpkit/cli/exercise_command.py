"""``mpkit exercise``'s handlers: the exercises and their nbgrader notebooks (printing only)."""
from mpkit.exercises import EXERCISES
from mpkit.exercises.assignment import write_assignment


def cmd_list(args):
    for name, ex in EXERCISES.items():
        print(f"lab {ex.lab}  {name:<22} {len(ex.cases)} cases  {ex.title(args.lang)}")
    return 0


def cmd_assign(args):
    names = [n.strip() for n in args.exercises.split(",") if n.strip()]
    path = write_assignment(names, args.out, args.lang)
    print(f"wrote {path}: {len(names)} exercises, {sum(len(EXERCISES[n].cases) for n in names)} points")
    return 0
