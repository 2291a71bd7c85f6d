"""O/X (true/false) quizzes over the lab's item bank (``quizzes/*.yaml``).

``show`` and ``review`` build notebook widgets; ``hand_in`` puts a student's answers into an
assignment notebook (its last cell) so the notebook alone can be graded; ``load_bank`` and
``lint`` read and check the bank; ``ResultStore`` is one student's saved answers.
"""
from mpkit.quiz.bank import load_bank
from mpkit.quiz.handin import hand_in
from mpkit.quiz.lint import lint
from mpkit.quiz.store import ResultStore
from mpkit.quiz.widget import review, show

__all__ = ["show", "review", "hand_in", "load_bank", "lint", "ResultStore"]
