"""End to end with real nbgrader: assign -> generate_assignment -> validate -> three students answer
in notebooks run by nbclient -> collect -> autograde -> export, and exact scores (the course is
built once per session, tests/nbgrader_course.py, and shared with test_nbgrader_pasted_cell).

The students answer through ``Quiz.answer()`` and ``Quiz.submit()``, the methods a click on O, X
and Submit calls. Each student has their own results folder (their laptop), deleted before
grading: the submitted notebook alone is graded.

* kim: everything right -> 4 of 4;
* lee: one wrong, one blank, and a hand-edited ``quiz_results/lee.json`` claiming full marks
  submitted beside the notebook -> 2 of 4 (the file is never read);
* park: exam submitted with 1 right, then every quiz run again and answered right after seeing
  the key -> 1 of 4, and the graded notebook reports the retakes.
"""
import json

import nbformat
import pytest

from mpkit.quiz.handin import HAND_IN_ID
from nbgrader_course import GOOD, ITEMS, KEY

EXPECTED = {"kim": 4.0, "lee": 2.0, "park": 1.0}


@pytest.mark.timeout(420)
def test_nbgrader_release_autograde_export(hw1_course):
    c = hw1_course
    assert c.assigned == 0 and "configure(c)" in c.config
    hand_in = [x for x in c.released.cells if x.metadata.get("nbgrader", {}).get("grade_id") == HAND_IN_ID]
    assert len(hand_in) == 1 and "ANSWER_KEY" not in hand_in[0].source and "quiz.hand_in(" in hand_in[0].source
    assert "NotImplementedError" not in json.dumps(c.released) and "STUDENT" not in json.dumps(c.released)
    assert c.validated.count("Success! Your notebook passes all the tests.") == 2, c.validated
    assert c.kim_files == ["hw1.ipynb"]   # collected: the notebook only (before lee's edited file)
    # ahn (kim's answers, a pasted cell: tests/test_nbgrader_pasted_cell.py) is graded in the same course
    assert c.scores == {student: (score, 4.0) for student, score in {**EXPECTED, "ahn": 4.0}.items()}

    graded = nbformat.read(c.autograded / "park" / "hw1" / "hw1.ipynb", as_version=4)
    cell = next(x for x in graded.cells if x.metadata.get("nbgrader", {}).get("grade_id") == HAND_IN_ID)
    report = cell.outputs[0]["data"]["text/html"]
    assert "4 item(s) answered again after the key was shown: graded on the first answer" in report
    assert cell.outputs[-1]["output_type"] == "execute_result" and cell.outputs[-1]["data"]["text/plain"] == "1.0"
    assert not c.grader_store.exists()   # autograde never read or wrote the grader's own answers
    assert not c.ran.exists()            # nor ran a cell a student added (kept as a raw cell to read)
    graded = nbformat.read(c.autograded / "kim" / "hw1" / "hw1.ipynb", as_version=4)
    assert [x.cell_type for x in graded.cells if str(c.ran) in x.source] == ["raw"]


# ---- the two preprocessors and configure(), on notebooks built here (no kernel, fast) ----

def _assignment(sheet=..., outputs=None):
    """A submitted assignment notebook: the hand-in cell as `mpkit quiz assign` writes it for
    nbgrader, its output the answer sheet (``...``: none, the cell was not run)."""
    from mpkit.quiz.assignment import hand_in_source
    from mpkit.quiz.bank import load_bank
    from mpkit.quiz.handin import AnswerSheet

    items = load_bank(GOOD).select(ITEMS.split(","))
    cell = nbformat.v4.new_code_cell(hand_in_source("hw1", items, "ko", key=True), metadata={"nbgrader": {
        "grade": True, "solution": False, "locked": True, "grade_id": HAND_IN_ID, "points": 8, "schema_version": 3}})
    if outputs is not None:
        cell.outputs = outputs
    elif sheet is not ...:
        cell.outputs = [nbformat.v4.new_output("display_data", data=AnswerSheet(sheet)._repr_mimebundle_())]
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("from mpkit import quiz"), cell])


def _sheet(answers):
    return {"format": "mpkit-quiz-answers", "version": 1, "assignment": "hw1", "items": ITEMS.split(","),
            "answers": answers}


def _autograde(nb):
    """What nbgrader does around the kernel: collect, ClearOutput, (Execute), score."""
    from nbgrader.preprocessors import ClearOutput
    from mpkit.quiz.nbgrader import CollectQuizAnswers, ScoreQuizAnswers

    nb, _ = CollectQuizAnswers().preprocess(nb, {})
    nb, _ = ClearOutput().preprocess(nb, {})
    nb.cells[-1].outputs = [nbformat.v4.new_output("error", ename="RuntimeError", evalue="x", traceback=[])]
    return ScoreQuizAnswers().preprocess(nb, {})[0]


@pytest.mark.parametrize("answers, credit", [
    ({}, 0.0),
    ({"mp-001": ["O"], "mp-002": ["X"], "mp-003": ["O"], "pp-001": ["O"]}, 8.0),
    ({"mp-001": ["O"], "mp-002": [None, "X"], "mp-003": ["X", "O"]}, 2.0),     # blanks and retakes don't count
    ({"zz-999": ["O"], "mp-001": ["O", "X"]}, 2.0),                           # unknown items are ignored
])
def test_scored_as_partial_credit_that_nbgrader_reads(answers, credit):
    from nbgrader.utils import determine_grade

    cell = _autograde(_assignment(_sheet(answers))).cells[-1]
    assert [o.output_type for o in cell.outputs] == ["display_data", "execute_result"]
    assert determine_grade(cell) == (credit, 8.0)                         # 2 points per item here


def test_what_a_student_could_write_into_the_notebook_is_not_trusted():
    from mpkit.quiz.nbgrader import STASH

    nb = _assignment()
    nb.metadata[STASH] = {"sheet": _sheet({i: [a] for i, a in KEY.items()}), "problem": None}   # forged
    cell = _autograde(nb).cells[-1]
    assert cell.outputs[-1]["data"]["text/plain"] == "0.0"
    assert "no answer sheet in the notebook: the hand-in cell was not run before saving" in \
        cell.outputs[0]["data"]["text/html"]


@pytest.mark.parametrize("outputs, problem", [
    ([nbformat.v4.new_output("display_data", data={"application/vnd.mpkit.quiz-answers+json": {"format": "x"}})],
     "not an mpkit answer sheet"),
    ([nbformat.v4.new_output("stream", text="hello")], "the hand-in cell was not run before saving"),
])
def test_a_missing_or_broken_sheet_scores_zero_and_says_why(outputs, problem):
    cell = _autograde(_assignment(outputs=outputs)).cells[-1]
    assert cell.outputs[-1]["data"]["text/plain"] == "0.0" and problem in cell.outputs[0]["data"]["text/html"]


def test_cells_the_student_added_are_kept_but_never_run():
    from nbgrader.preprocessors import ClearOutput
    from mpkit.quiz.nbgrader import CollectQuizAnswers, SkipAddedCells

    nb = _assignment(_sheet({}))
    nb.cells.insert(1, nbformat.v4.new_code_cell("import os; os.remove('gradebook.db')"))
    nb.cells.insert(2, nbformat.v4.new_code_cell("print('x')", metadata={"nbgrader": {"locked": False}}))
    nb.cells.insert(3, nbformat.v4.new_markdown_cell("my notes"))
    nb.cells[0].metadata["nbgrader"] = {"grade_id": "setup", "locked": True, "grade": False, "solution": False}
    nb, _ = ClearOutput().preprocess(CollectQuizAnswers().preprocess(nb, {})[0], {})
    nb, _ = SkipAddedCells().preprocess(nb, {})
    assert [c.cell_type for c in nb.cells] == ["code", "raw", "raw", "markdown", "code"]
    assert "os.remove" in nb.cells[1].source and "outputs" not in nb.cells[1]
    nbformat.validate(nb)


def test_notebooks_that_are_not_mpkit_assignments_are_left_alone():
    from mpkit.quiz.nbgrader import CollectQuizAnswers, ScoreQuizAnswers, SkipAddedCells

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    before = json.loads(json.dumps(nb))
    nb = ScoreQuizAnswers().preprocess(CollectQuizAnswers().preprocess(nb, {})[0], {})[0]
    nb = SkipAddedCells().preprocess(nb, {})[0]
    assert json.loads(json.dumps(nb)) == before


def test_misconfiguration_fails_loudly(monkeypatch):
    from mpkit.quiz import hand_in
    from mpkit.quiz.nbgrader import CollectQuizAnswers, ScoreQuizAnswers

    with pytest.raises(RuntimeError, match="answers were not collected"):
        ScoreQuizAnswers().preprocess(_assignment(_sheet({})), {})        # CollectQuizAnswers missing
    nb = _assignment(_sheet({}))
    nb.cells[-1].source = "quiz.hand_in('hw1', ['mp-001'])"               # the key is gone
    with pytest.raises(ValueError, match="the hand-in cell has no ANSWER_KEY"):
        ScoreQuizAnswers().preprocess(CollectQuizAnswers().preprocess(nb, {})[0], {})
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(RuntimeError, match=r"Add these two lines to nbgrader_config.py"):
        hand_in("hw1", ["mp-001"])                                        # autograde without the preprocessors


def test_configure_inserts_around_nbgraders_own_steps_once():
    from nbgrader.preprocessors import CheckCellMetadata, ClearOutput, Execute, OverwriteCells, SaveAutoGrades
    from traitlets.config import Config

    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor

    from mpkit.quiz.nbgrader import (CollectQuizAnswers, RestoreCells, ScoreQuizAnswers, SkipAddedCells,
                                     WrapFeedbackLines, configure)

    c = Config()
    configure(c)
    configure(c)
    sanitize, autograde = c.Autograde.sanitize_preprocessors, c.Autograde.autograde_preprocessors
    assert sanitize.count(CollectQuizAnswers) == 1 and autograde.count(ScoreQuizAnswers) == 1
    assert OverwriteCells not in sanitize  # RestoreCells restores in its place (and warns only on real edits)
    assert sanitize.index(CollectQuizAnswers) < sanitize.index(ClearOutput) < sanitize.index(RestoreCells)
    feedback = c.GenerateFeedback.preprocessors
    assert feedback.index(CSSHTMLHeaderPreprocessor) < feedback.index(WrapFeedbackLines) and feedback.count(WrapFeedbackLines) == 1
    assert autograde.index(Execute) + 1 == autograde.index(ScoreQuizAnswers) < autograde.index(SaveAutoGrades)
    assert autograde.index(SkipAddedCells) + 1 == autograde.index(Execute) and autograde.count(SkipAddedCells) == 1
    custom = Config()
    custom.Autograde.autograde_preprocessors = [Execute, SaveAutoGrades]
    custom.Autograde.sanitize_preprocessors.append(OverwriteCells)           # a lazy edit is kept too
    configure(custom)
    assert custom.Autograde.autograde_preprocessors == [SkipAddedCells, Execute, ScoreQuizAnswers, SaveAutoGrades]
    assert custom.Autograde.sanitize_preprocessors[0] is CollectQuizAnswers
    assert custom.Autograde.sanitize_preprocessors[-2:] == [CheckCellMetadata, RestoreCells]
