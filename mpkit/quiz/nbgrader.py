"""nbgrader glue: autograde an mpkit assignment from the answer sheet inside the submitted notebook.

nbgrader 0.9 autogrades in two passes over each submission: *sanitize* (``ClearOutput`` first,
which empties every code cell's outputs, then ``OverwriteCells``, which restores locked cells, the
key included, from its database) writes the notebook to ``autograded/``, then *autograde* runs it
(``Execute``) and ``SaveAutoGrades`` records each graded cell's score: an error scores 0, an
``execute_result`` that reads as a number scores that number (partial credit).

The answers live in the hand-in cell's output, which ``ClearOutput`` would erase, so
:func:`configure` adds preprocessors around nbgrader's own:

* :class:`CollectQuizAnswers`, first in the sanitize pass: copies the answer sheet of the
  submitted hand-in cell into the notebook's metadata (under ``mpkit_quiz``; anything a student
  put there is replaced), where it survives to the second pass;
* :class:`ContainBrokenCells`, right before ``CheckCellMetadata`` in the sanitize pass: a cell
  whose nbgrader metadata does not validate (a pasted copy of a quiz cell, which nbgrader's own
  ``DeduplicateIds`` leaves so) becomes a cell the student added, so one bad notebook costs only
  its own cells, with the reason in its report, instead of stopping the whole class's autograde;
* :class:`SkipAddedCells`, right before ``Execute``: turns every code cell that is not one of the
  assignment's own (after ``OverwriteCells`` those are exactly the cells with a ``grade_id``, their
  source restored from nbgrader's database) into a raw cell, so a cell the student added is kept
  for the instructor to read but never run in the grader's kernel (the quiz needs no student code);
* :class:`ScoreQuizAnswers`, right after ``Execute``: reads the key from the restored hand-in
  cell with :func:`ast.literal_eval` (nothing a student wrote is executed by it), marks the sheet
  with :mod:`mpkit.quiz.marking` (first answers count) and makes the cell's output the per-item
  table plus the score, replacing whatever the student's kernel printed there.

Two more, for any assignment with hidden tests (quizzes and ``mpkit exercise assign``'s exercises):

* :class:`RestoreCells` replaces nbgrader's ``OverwriteCells``: it restores locked cells alike, but
  warns ``Attribute 'checksum' for cell ... has changed!`` only for a cell the student changed.
  nbgrader's own warned for every cell with hidden tests in every submission (its database holds
  the checksum of the instructor's copy, the students got the cell without its hidden tests), so
  the one warning that mattered, a student who edited a test cell, was lost among them;
* :class:`WrapFeedbackLines`, in ``GenerateFeedback``: lines of the feedback pages (a check's
  message, a traceback) wrap at the page's width instead of running off it.

Who the student is comes from nbgrader (the ``submitted/<student id>/`` folder), never from
the notebook. The quiz classes do nothing to notebooks without an mpkit hand-in cell, so one course
config serves every assignment. In ``nbgrader_config.py``::

    from mpkit.quiz.nbgrader import configure
    configure(c)
"""
import ast
import json
from collections import Counter
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.converters import Autograde
from nbgrader.nbgraderformat import MetadataValidator, ValidationError
from nbgrader.nbgraderformat.common import SchemaMismatchError
from nbgrader.converters import GenerateFeedback
from nbgrader.preprocessors import CheckCellMetadata, ClearHiddenTests, Execute, NbGraderPreprocessor, OverwriteCells

from mpkit.i18n import LANGS, t
from mpkit.quiz.assignment import KEY_NAME
from mpkit.quiz.handin import HAND_IN_ID, AnswerSheetError, hand_in_cell, marked_html, sheet_in_cell
from mpkit.quiz.marking import mark
from mpkit.quiz.store import ANSWERS

STASH = "mpkit_quiz"
LEDGER = "mpkit_graded.json"  # beside the gradebook: which submission of each student was graded


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
        nb.metadata[STASH] = {"sheet": sheet, "problem": problem, "notes": _duplicated(nb)}
        self._note_replaced(resources)
        return nb, resources

    def _note_replaced(self, resources):
        """Warn when a student's graded submission is replaced by a newer one (``nbgrader collect
        --update``): nbgrader knows a student only by the login that submitted, so on a shared OS
        account ``nbgrader submit --student <id>`` from anyone does exactly this. A ledger beside
        an sqlite gradebook (``mpkit_graded.json``) remembers which submission was graded."""
        where = resources.get("nbgrader") if isinstance(resources, dict) else None
        if not where or not str(where.get("db_url", "")).startswith("sqlite:///"):
            return
        with Gradebook(where["db_url"]) as gradebook:
            try:
                stamp = gradebook.find_submission(where["assignment"], where["student"]).timestamp
            except MissingEntry:
                return
        if stamp is None:
            return
        ledger = Path(where["db_url"].removeprefix("sqlite:///")).parent / LEDGER
        try:
            graded = json.loads(ledger.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            graded = {}
        key = f"{where['assignment']}/{where['student']}"
        if graded.get(key) not in (None, stamp.isoformat()):
            self.log.warning("mpkit: %s's graded submission of %s (submitted %s) was replaced by one submitted %s. "
                             "If students share an OS account, anyone can do this with `nbgrader submit --student "
                             "%s`: give each student their own login (README, trust model)",
                             where["student"], where["assignment"], graded[key], stamp.isoformat(), where["student"])
        graded[key] = stamp.isoformat()
        try:
            ledger.write_text(json.dumps(graded, indent=1, sort_keys=True), encoding="utf-8")
        except OSError as exc:
            self.log.warning("mpkit: could not write %s (%s): replaced submissions will not be noticed", ledger, exc)


def _grade_id(cell):
    meta = cell.get("metadata")
    nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
    return nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None


def _not_graded(cell, reason, **values):
    return " / ".join(t("cell_not_graded", lang, cell=cell, why=t(reason, lang, **values)) for lang in LANGS)


def _duplicated(nb):
    """Notes for the report on cells whose nbgrader id appears more than once (a pasted quiz cell):
    nbgrader's ``DeduplicateIds`` keeps the last and empties the others' metadata."""
    counts = Counter(i for i in map(_grade_id, nb.cells) if i)
    return [_not_graded(f"'{i}'", "pasted_copies", n=n - 1) for i, n in counts.items() if n > 1]


class ContainBrokenCells(NbGraderPreprocessor):
    """Sanitize pass, right before nbgrader's ``CheckCellMetadata``: a cell whose nbgrader metadata
    does not validate loses it, and becomes a cell the student added, instead of stopping
    ``nbgrader autograde`` for the whole class. nbgrader 0.9.6's own ``DeduplicateIds`` leaves such
    a cell for every pasted copy of a graded cell (metadata ``{}``, read as a schema too old), and
    ``CheckCellMetadata`` then raises the error that ends the run ("old version of the nbgrader
    metadata format"): every later student stayed ungraded. Now it costs only the cells
    concerned, in that student's notebook, and the report says so."""

    def preprocess(self, nb, resources):
        validator = MetadataValidator()
        for index, cell in enumerate(nb.cells):
            meta = cell.get("metadata")
            if not isinstance(meta, dict) or "nbgrader" not in meta:
                continue
            try:
                validator.validate_cell(cell)
            except (SchemaMismatchError, ValidationError) as exc:
                name = f"{index + 1} ({_grade_id(cell) or 'no id'})"
                why = str(exc).splitlines()[0]
                self.log.warning("mpkit: cell %s has invalid nbgrader metadata (%s); it is left ungraded", name, why)
                pasted = meta.pop("nbgrader") == {}  # DeduplicateIds' doing: CollectQuizAnswers noted the id
                if STASH in nb.metadata and not pasted:
                    nb.metadata[STASH]["notes"].append(_not_graded(name, "bad_metadata", detail=why))
        return nb, resources


class SkipAddedCells(NbGraderPreprocessor):
    """Autograde pass, before ``Execute``: code cells the student added become raw cells (not run)."""

    def preprocess(self, nb, resources):
        if not _is_quiz_assignment(nb, resources):
            return nb, resources
        for cell in nb.cells:
            if cell.cell_type == "code" and not _grade_id(cell):
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
        note = " ".join(filter(None, [stash["problem"], *stash.get("notes", [])])) or None
        cell.outputs = [
            nbformat.v4.new_output("display_data", data={"text/html": marked_html(marks, note)}),
            nbformat.v4.new_output("execute_result", data={"text/plain": repr(earned)},
                                   execution_count=cell.get("execution_count")),
        ]
        return nb, resources


class RestoreCells(OverwriteCells):
    """Sanitize pass, in place of nbgrader's ``OverwriteCells``: the same restoring, and its
    checksum warning only for a locked cell that differs from the copy the students were given
    (the instructor's with its hidden tests removed), i.e. one a student edited."""

    def preprocess_cell(self, cell, resources, cell_index):
        self._as_released = self._is_as_released(cell)
        return super().preprocess_cell(cell, resources, cell_index)

    def _is_as_released(self, cell):
        grade_id = _grade_id(cell)
        if not grade_id:
            return False
        try:
            source = self.gradebook.find_source_cell(grade_id, self.notebook_id, self.assignment_id)
        except MissingEntry:
            return False
        released = nbformat.from_dict({"cell_type": source.cell_type, "source": source.source, "metadata": {}})
        return (ClearHiddenTests(config=self.config)._remove_hidden_test_region(released)  # nbgrader's own stripping
                and cell.source == released.source)

    def report_change(self, name, attr, old, new):
        if attr == "checksum" and self._as_released:
            self.log.debug("mpkit: cell %s as released (hidden tests put back)", name)
            return
        super().report_change(name, attr, old, new)


# nbgrader's feedback template keeps each output line on one line of a <pre>
WRAP_CSS = "pre { white-space: pre-wrap; overflow-wrap: anywhere; }"


class WrapFeedbackLines(NbGraderPreprocessor):
    """GenerateFeedback, after nbconvert's ``CSSHTMLHeaderPreprocessor`` (which sets the page's
    inlined CSS): long lines wrap at the page's width."""

    def preprocess(self, nb, resources):
        resources.setdefault("inlining", {}).setdefault("css", []).append(WRAP_CSS)
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
    """Add :class:`CollectQuizAnswers`, :class:`ContainBrokenCells`, :class:`SkipAddedCells` and
    :class:`ScoreQuizAnswers` to nbgrader's autograde preprocessors in config ``c``, put
    :class:`RestoreCells` in ``OverwriteCells``' place and :class:`WrapFeedbackLines` into
    ``GenerateFeedback`` (idempotent; keeps lists the course already customised)."""
    def current(section, cls, name):
        default = list(cls.class_traits()[name].default())
        value = c[section].get(name)
        if hasattr(value, "get_value"):  # a lazy edit such as c.Autograde.x.append(...)
            return list(value.get_value(default))
        return list(value) if isinstance(value, list) else default

    sanitize = [RestoreCells if p is OverwriteCells else p for p in current("Autograde", Autograde, "sanitize_preprocessors")
                if p not in (CollectQuizAnswers, ContainBrokenCells)]
    check = next((i for i, p in enumerate(sanitize) if isinstance(p, type) and issubclass(p, CheckCellMetadata)),
                 len(sanitize))
    sanitize.insert(check, ContainBrokenCells)
    autograde = [p for p in current("Autograde", Autograde, "autograde_preprocessors")
                 if p not in (SkipAddedCells, ScoreQuizAnswers)]
    run = next((i for i, p in enumerate(autograde) if isinstance(p, type) and issubclass(p, Execute)), None)
    if run is None:
        raise ValueError("Autograde.autograde_preprocessors has no Execute step to score after")
    autograde[run:run + 1] = [SkipAddedCells, autograde[run], ScoreQuizAnswers]
    c.Autograde.sanitize_preprocessors = [CollectQuizAnswers, *sanitize]
    c.Autograde.autograde_preprocessors = autograde
    c.GenerateFeedback.preprocessors = [*(p for p in current("GenerateFeedback", GenerateFeedback, "preprocessors")
                                          if p is not WrapFeedbackLines), WrapFeedbackLines]
