"""Exercises: the learner writes each mechanism, a checker says precisely what is wrong.

``check(name, fn)`` runs the learner's ``fn`` over several cases, each exercise its own (on 2 to 8
simulated devices, with sizes that do not divide evenly, several steps and frozen parameters where
they apply; schedules as instruction lists on the simulator; formulas in one process), and compares
every rank's result with the single-device reference and, for the cost-graded ones, the cost with
its target (``traffic``: bytes a rank sends; ``held``: what a forward keeps for backward);
``show(name, get_fn)`` is the same behind a Check button, with three levels of hints. ``EXERCISES`` lists them by name; each names
the lab that teaches it. Instructors hand them out with ``mpkit exercise assign`` (nbgrader).
"""
from mpkit.exercises.catalog import EXERCISES, by_lab, get
from mpkit.exercises.checker import check
from mpkit.exercises.progress import passed_exercises
from mpkit.exercises.result import CheckResult
from mpkit.exercises.widget import show

__all__ = ["EXERCISES", "by_lab", "get", "check", "show", "passed_exercises", "CheckResult"]
