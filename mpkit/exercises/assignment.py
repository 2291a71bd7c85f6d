"""Exercise notebooks for nbgrader: solution regions the release strips, hidden tests with points.

``write_assignment(names, out)`` writes the instructor's source notebook (``<course>/source/<a>/``):

1. how to work (markdown, Korean and English) and a locked setup cell (imports only);
2. per exercise: its title and hints (markdown), the solution cell — the stub's signature and
   docstring around ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` holding the reference body, so
   ``nbgrader generate_assignment`` hands out the signature with an empty body — then one graded
   test cell per case of the checker (one point each: partial credit). The first runs the check,
   visibly, so a student can self-check the released notebook; every assertion is a hidden test.

Autograde runs the learner's code only inside the checker's forked ranks, each case with a
timeout: a deadlock or an endless loop costs that exercise, never the run. nbgrader restores
every test cell from its database before grading, so an edited test cell changes nothing. Under
nbgrader's layout (``<course>/source/<a>/``) ``<course>/nbgrader_config.py`` gets mpkit's
preprocessors (:func:`mpkit.quiz.nbgrader.configure`), as ``mpkit quiz assign`` does: autograde then
warns about a test cell's checksum only when a student edited it, not for every hidden test.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

import nbformat

from mpkit.exercises import solutions
from mpkit.exercises.catalog import get
from mpkit.i18n import check_lang
from mpkit.quiz.assignment import nbgrader_course, register_nbgrader

SETUP = ("import torch\nimport torch.distributed as dist\nimport torch.nn.functional as F\nfrom mpkit import exercises\n"
         "from mpkit.parallel.pipeline.schedules import (Backward, BackwardInput, BackwardWeight, Forward, OptimizerStep,\n"
         "                                               RecvAct, RecvGrad, SendAct, SendGrad)")
INTRO = ("## 직접 만들기 / Build it yourself\n\n"
         "각 연습의 `### YOUR CODE HERE` 자리에 코드를 쓰고, 바로 아래의 확인 셀을 실행해 보세요. 채점은 같은 검사기로 "
         "경우(case)마다 1점씩입니다. 확인 셀과 잠긴 셀은 고치지 마세요: 채점할 때 원래대로 복원됩니다.\n\n"
         "**EN** Write your code where each exercise says `YOUR CODE HERE`, then run the check cell right below it. "
         "Grading runs the same checker, one point per case. Do not edit the check cells or locked cells: grading "
         "restores them.")


def _meta(grade_id, *, solution=False, points=None, locked=False):
    meta = {"grade": points is not None, "solution": solution, "locked": locked, "task": False,
            "grade_id": grade_id, "schema_version": 3}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def solution_cell_source(exercise) -> str:
    """The stub's signatures and docstrings, each body replaced by a solution region holding the
    reference body (indented as the body)."""
    stub = exercise.stub
    lines = stub.splitlines()
    out = []
    references = {obj.__name__: obj for obj in solutions.definitions(exercise)}
    for node in ast.parse(stub).body:
        header_end = node.body[0].end_lineno if ast.get_docstring(node) is not None else node.lineno
        indent = " " * node.body[0].col_offset
        out += lines[node.lineno - 1:header_end]
        out += [f"{indent}### BEGIN SOLUTION", solutions.body(references[node.name]), f"{indent}### END SOLUTION", ""]
    return "\n".join(out).rstrip() + "\n"


def exercise_cells(name: str, lang: str) -> list:
    exercise = get(name)
    hints = "\n".join(f"{i}. {hint(lang)}" for i, hint in enumerate(exercise.hints[:2], 1))
    cells = [nbformat.v4.new_markdown_cell(f"### {exercise.title('ko')} / {exercise.title('en')}\n\n"
                                           f"{'힌트' if lang == 'ko' else 'Hints'}:\n{hints}",
                                           metadata=_meta(f"{name}-text", locked=True)),
             nbformat.v4.new_code_cell(solution_cell_source(exercise), metadata=_meta(f"{name}-solution", solution=True))]
    result = f"_check_{name}"
    for index, case in enumerate(exercise.cases):
        run = (f"{result} = exercises.check({name!r}, {exercise.target}, lang={lang!r})\nprint({result})\n"
               if index == 0 else "")
        test = (f"### BEGIN HIDDEN TESTS\nassert {result}.case({index}).passed, {result}.case({index}).message({lang!r})\n"
                f"### END HIDDEN TESTS")
        cells.append(nbformat.v4.new_code_cell(f"# {case.name(lang)}\n{run}{test}",
                                               metadata=_meta(f"{name}-case{index}", points=1)))
    return cells


def write_assignment(names, out, lang: str = "ko") -> Path:
    """The instructor's nbgrader source notebook for exercises ``names`` at ``out``; returns its path."""
    lang = check_lang(lang)
    if isinstance(names, str) or not names:
        raise ValueError("names: pass a list of exercise names, e.g. ['ring_all_reduce', 'zero1_step']")
    for name in names:
        get(name)
    if len(set(names)) != len(names):
        raise ValueError(f"names: {names} lists an exercise twice; nbgrader needs each cell id once")
    out = Path(out)
    if out.suffix != ".ipynb":
        raise ValueError(f"--out {out}: the notebook's name must end in .ipynb")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell(INTRO, metadata=_meta("exercises-intro", locked=True)),
                nbformat.v4.new_code_cell(SETUP, metadata=_meta("exercises-setup", locked=True))]
    for name in names:
        nb.cells += exercise_cells(name, lang)
    os.makedirs(out.parent, exist_ok=True)
    nbformat.write(nb, out)
    course = nbgrader_course(out)
    if course is not None:  # mpkit's preprocessors: checksum warnings only for edited cells, wrapped feedback
        register_nbgrader(course)
    return out
