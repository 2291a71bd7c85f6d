"""A learner's exercise results, kept in the same results file as their quiz answers.

``record_check`` appends one entry per check under ``"exercises"`` through the quiz store's one
writer path (lock, re-read, atomic replace), so checks and quiz answers from several kernels
never lose each other, and a killed kernel leaves the old file or the new one.
"""
from __future__ import annotations

import os

from mpkit.quiz.store import ResultStore, now


def record_check(result, student=None, results_dir=None) -> None:
    """Nothing is written for an untouched stub, nor under nbgrader autograde (the grader's own
    files are never touched from a student's notebook; the grade is the notebook's)."""
    if result.not_done or os.environ.get("NBGRADER_EXECUTION") == "autograde":
        return
    done, total = result.score
    store = ResultStore(student=student, results_dir=results_dir)
    store.record_exercise(result.exercise, passed=result.passed, score=[done, total], at=now())


def passed_exercises(student=None, results_dir=None) -> list[str]:
    """Names of the exercises this learner has passed at least once, in the order first passed."""
    data = ResultStore(student=student, results_dir=results_dir).data
    entries = data.get("exercises", {})
    firsts = {name: next((e["at"] for e in entry["history"] if e["passed"]), None) for name, entry in entries.items()}
    return [name for name, at in sorted(((n, a) for n, a in firsts.items() if a), key=lambda x: x[1])]
