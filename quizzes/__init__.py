"""The O/X item banks (the *.yaml files here), installed as the package data ``mpkit.quizzes``.

pyproject.toml maps this folder to ``mpkit/quizzes`` in the wheel; ``mpkit.quiz.bank`` reads it
with ``importlib.resources``. This file only makes the folder a package; add banks as *.yaml.
"""
