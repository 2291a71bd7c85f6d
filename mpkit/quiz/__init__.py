"""O/X (true/false) quizzes over the lab's item bank (``quizzes/*.yaml``).

``show`` and ``review`` build notebook widgets; ``load_bank`` and ``lint`` read and check the
bank; ``points`` scores a student's saved answers (used by generated assignment notebooks).
"""
from mpkit.quiz.bank import load_bank
from mpkit.quiz.instructor import points
from mpkit.quiz.lint import lint
from mpkit.quiz.widget import review, show

__all__ = ["show", "review", "load_bank", "lint", "points"]
