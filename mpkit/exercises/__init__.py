"""Exercises: the learner writes each mechanism, a checker says precisely what is wrong.

``check(name, fn)`` runs the learner's ``fn`` on simulated devices over several cases (2 to 4
ranks, sizes that do not divide evenly, several steps, frozen parameters where they apply) and
compares every rank's result with the single-device reference; ``show(name, get_fn)`` is the same
behind a Check button, with three levels of hints. ``EXERCISES`` lists them by name; each names
the lab that teaches it. Instructors hand them out with ``mpkit exercise assign`` (nbgrader).
"""
from mpkit.exercises.catalog import EXERCISES, by_lab, get
from mpkit.exercises.checker import check
from mpkit.exercises.progress import passed_exercises
from mpkit.exercises.result import CheckResult
from mpkit.exercises.widget import show

__all__ = ["EXERCISES", "by_lab", "get", "check", "show", "passed_exercises", "CheckResult"]
