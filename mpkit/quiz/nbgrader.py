"""nbgrader glue: autograde an mpkit assignment from the answer sheet inside the submitted notebook.

nbgrader 0.9 autogrades in two passes over each submission: *sanitize* (``ClearOutput`` first,
which empties every code cell's outputs, then ``OverwriteCells``, which restores locked cells, the
key included, from its database) writes the notebook to ``autograded/``, then *autograde* runs it
(``Execute``) and ``SaveAutoGrades`` records each graded cell's score: an error scores 0, an
``execute_result`` that reads as a number scores that number (partial credit).

The answers live in the hand-in cell's output, which ``ClearOutput`` would erase, so
:func:`configure` adds two preprocessors around nbgrader's own:

* :class:`CollectQuizAnswers`, first in the sanitize pass: copies the answer sheet of the
  submitted hand-in cell into the notebook's metadata (under ``mpkit_quiz``; anything a student
  put there is replaced), where it survives to the second pass;
* :class:`SkipAddedCells`, right before ``Execute``: turns every code cell that is not one of the
  assignment's own (after ``OverwriteCells`` those are exactly the cells with a ``grade_id``, their
  source restored from nbgrader's database) into a raw cell, so a cell the student added is kept
  for the instructor to read but never run in the grader's kernel (the quiz needs no student code);
* :class:`ScoreQuizAnswers`, right after ``Execute``: reads the key from the restored hand-in
  cell with :func:`ast.literal_eval` (nothing a student wrote is executed by it), marks the sheet
  with :mod:`mpkit.quiz.marking` (first answers count) and makes the cell's output the per-item
  table plus the score, replacing whatever the student's kernel printed there.

Who the student is comes from nbgrader (the ``submitted/<student id>/`` folder), never from
the notebook. Both classes do nothing to notebooks without an mpkit hand-in cell, so one course
config serves every assignment. In ``nbgrader_config.py``::

    from mpkit.quiz.nbgrader import configure
    configure(c)
"""
import ast

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.converters import Autograde
from nbgrader.preprocessors import Execute, NbGraderPreprocessor

from mpkit.i18n import LANGS, t
from mpkit.quiz.assignment import KEY_NAME
from mpkit.quiz.handin import HAND_IN_ID, AnswerSheetError, hand_in_cell, marked_html, sheet_in_cell
from mpkit.quiz.marking import mark
from mpkit.quiz.store import ANSWERS

STASH = "mpkit_quiz"


class CollectQuizAnswers(NbGraderPreprocessor):
    """Sanitize pass, before ``ClearOutput``: keep the submitted answer sheet in the metadata."""

    def preprocess(self, nb, resources):
        nb.metadata.pop(STASH, None)
        cell = hand_in_cell(nb, "the submitted notebook")
        if cell is None:
            return nb, resources
        try:
            sheet = sheet_in_cell(cell, "the submitted hand-in cell")
            problem = None if sheet else " / ".join(t("no_sheet", lang) for lang in LANGS)
        except AnswerSheetError as exc:
            sheet, problem = None, str(exc)
        if problem:
            self.log.warning("mpkit quiz: %s", problem)
        nb.metadata[STASH] = {"sheet": sheet, "problem": problem}
        return nb, resources


class SkipAddedCells(NbGraderPreprocessor):
    """Autograde pass, before ``Execute``: code cells the student added become raw cells (not run)."""

    def preprocess(self, nb, resources):
        if not _is_quiz_assignment(nb, resources):
            return nb, resources
        for cell in nb.cells:
            meta = cell.get("metadata")
            nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
            if cell.cell_type == "code" and not (isinstance(nbgrader, dict) and nbgrader.get("grade_id")):
                cell.cell_type = "raw"
                cell.pop("outputs", None)
                cell.pop("execution_count", None)
        return nb, resources


def _is_quiz_assignment(nb, resources):
    """Whether the assignment has an mpkit hand-in cell: asked of nbgrader's database when there is
    one (a student who deleted the cell from the notebook does not change the answer), else of ``nb``."""
    where = resources.get("nbgrader") if isinstance(resources, dict) else None
    if not where or "db_url" not in where:
        return hand_in_cell(nb, "the notebook") is not None
    with Gradebook(where["db_url"]) as gradebook:
        try:
            gradebook.find_source_cell(HAND_IN_ID, where["notebook"], where["assignment"])
        except MissingEntry:
            return False
    return True


class ScoreQuizAnswers(NbGraderPreprocessor):
    """Autograde pass, after ``Execute``: score the kept sheet with the key of the hand-in cell."""

    def preprocess(self, nb, resources):
        cell = hand_in_cell(nb, "the notebook")
        if cell is None:
            return nb, resources
        if STASH not in nb.metadata:
            raise RuntimeError("mpkit quiz: the answers were not collected before nbgrader cleared the "
                               "outputs; call mpkit.quiz.nbgrader.configure(c) in nbgrader_config.py")
        stash = nb.metadata[STASH]
        sheet = stash["sheet"]
        marks = mark(read_key(cell.source), sheet["answers"] if sheet else {})
        points = float(cell.metadata.nbgrader["points"])
        earned = points * sum(m.correct for m in marks) / len(marks)
        self.log.info("mpkit quiz: %d of %d items right (first answers), %g of %g points",
                      sum(m.correct for m in marks), len(marks), earned, points)
        cell.outputs = [
            nbformat.v4.new_output("display_data", data={"text/html": marked_html(marks, stash["problem"])}),
            nbformat.v4.new_output("execute_result", data={"text/plain": repr(earned)},
                                   execution_count=cell.get("execution_count")),
        ]
        return nb, resources


def read_key(source):
    """``ANSWER_KEY`` (item id -> "O"/"X") from the hand-in cell's source, parsed, not run."""
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == KEY_NAME):
            key = ast.literal_eval(node.value)
            if (isinstance(key, dict) and key and all(isinstance(i, str) for i in key)
                    and all(a in ANSWERS for a in key.values())):
                return key
            break
    raise ValueError(f"mpkit quiz: the hand-in cell has no {KEY_NAME} = {{item id: 'O' or 'X', ...}} "
                     "in its hidden tests; write the assignment again with `mpkit quiz assign`")


def configure(c):
    """Add :class:`CollectQuizAnswers`, :class:`SkipAddedCells` and :class:`ScoreQuizAnswers` to
    nbgrader's autograde preprocessors in config ``c`` (idempotent; keeps lists the course already
    customised)."""
    def current(name):
        default = list(Autograde.class_traits()[name].default())
        value = c.Autograde.get(name)
        if hasattr(value, "get_value"):  # a lazy edit such as c.Autograde.x.append(...)
            return list(value.get_value(default))
        return list(value) if isinstance(value, list) else default

    sanitize = [p for p in current("sanitize_preprocessors") if p is not CollectQuizAnswers]
    autograde = [p for p in current("autograde_preprocessors") if p not in (SkipAddedCells, ScoreQuizAnswers)]
    run = next((i for i, p in enumerate(autograde) if isinstance(p, type) and issubclass(p, Execute)), None)
    if run is None:
        raise ValueError("Autograde.autograde_preprocessors has no Execute step to score after")
    autograde[run:run + 1] = [SkipAddedCells, autograde[run], ScoreQuizAnswers]
    c.Autograde.sanitize_preprocessors = [CollectQuizAnswers, *sanitize]
    c.Autograde.autograde_preprocessors = autograde
