"""One student's pasted quiz cell (a copy with the same nbgrader id) costs at most that student's
grade, never the class's (issue 36): with real nbgrader 0.9.6, its ``DeduplicateIds`` empties the
copy's metadata and ``CheckCellMetadata`` then stopped ``nbgrader autograde`` for everyone ("old
version of the nbgrader metadata format"), leaving every later student ungraded."""
import html

import nbformat
import pytest

import test_nbgrader as e2e


@pytest.mark.timeout(420)
def test_a_pasted_quiz_cell_does_not_stop_the_class(hw1_course):
    """ahn (graded first, by name) hands in kim's answers with the quiz cell pasted once more
    (tests/nbgrader_course.py): autograde's returncode 0 there means every student was graded."""
    assert "Cell with id 'quiz_model_parallel' exists multiple times!" in hw1_course.log
    assert "SAWarning" not in hw1_course.log   # SQLAlchemy pinned to 1.4 (requirements-test.txt): 2.x warned per student
    scores = {student: score for student, (score, _) in hw1_course.scores.items()}
    assert scores == {"ahn": 4.0, "kim": 4.0, "lee": 2.0, "park": 1.0}
    graded = nbformat.read(hw1_course.autograded / "ahn" / "hw1" / "hw1.ipynb", as_version=4)
    report = next(c for c in graded.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "quiz_hand_in")
    assert ("cell 'quiz_model_parallel' was not graded: 1 pasted copy/copies share its nbgrader id; the last one "
            "counts" in html.unescape(report.outputs[0]["data"]["text/html"]))
    quiz = next(c for c in graded.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "quiz_model_parallel")
    assert [c.cell_type for c in graded.cells if c.source == quiz.source] == ["raw", "code"]  # the copy: kept, not run


def test_a_cell_with_broken_metadata_is_left_ungraded_and_said_so():
    from nbgrader.preprocessors import CheckCellMetadata
    from mpkit.quiz.nbgrader import STASH, CollectQuizAnswers, ContainBrokenCells

    nb = e2e._assignment(e2e._sheet({}))
    nb.cells.insert(1, nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {"grade": True, "schema_version": 1}}))
    nb.cells.insert(2, nbformat.v4.new_code_cell("y = 2", metadata={"nbgrader": {}}))
    nb, _ = CollectQuizAnswers().preprocess(nb, {})
    nb, _ = ContainBrokenCells().preprocess(nb, {})
    CheckCellMetadata().preprocess(nb, {})            # raised before: the whole class's autograde stopped
    assert "nbgrader" not in nb.cells[1].metadata and "nbgrader" not in nb.cells[2].metadata
    assert nb.cells[-1].metadata["nbgrader"]["grade_id"] == "quiz_hand_in"  # the valid cells keep theirs
    notes = nb.metadata[STASH]["notes"]
    assert len(notes) == 1 and "cell 2 (no id) was not graded: its nbgrader metadata is invalid (Outdated" in notes[0]


def test_configure_puts_the_containment_right_before_nbgraders_check():
    from nbgrader.preprocessors import CheckCellMetadata, DeduplicateIds
    from traitlets.config import Config
    from mpkit.quiz.nbgrader import ContainBrokenCells, configure

    c = Config()
    configure(c)
    configure(c)
    sanitize = c.Autograde.sanitize_preprocessors
    assert sanitize.count(ContainBrokenCells) == 1
    assert sanitize.index(DeduplicateIds) < sanitize.index(ContainBrokenCells) == sanitize.index(CheckCellMetadata) - 1
