"""The hand-in: a student's answers, carried inside the assignment notebook itself.

A widget click cannot write into a saved notebook (JupyterLab keeps only outputs of cells being
run), so the assignment's last cell, ``quiz.hand_in(...)``, shows an **answer sheet**: every
answer recorded for the assignment on this machine, as an HTML table for the student and as JSON
under :data:`MIME` for graders. The student runs it last and saves; the submitted ``.ipynb`` alone
is then enough to grade (:mod:`mpkit.quiz.nbgrader` with nbgrader, ``mpkit quiz grade`` without).

Sheet layout (``FORMAT``/``VERSION`` tag it)::

    {"format": "mpkit-quiz-answers", "version": 1, "assignment": "hw1",
     "items": ["mp-001", "mp-002"], "answers": {"mp-001": ["X", "O"], "mp-002": [null]}}

``answers`` lists each item's recorded answers in order (null: left blank in a submitted exam).
It holds no name: with nbgrader the submission folder says who the student is, without it the
collected file's name does.
"""
import html
import os
import re
import weakref

from mpkit.i18n import LANGS, check_lang, t
from mpkit.quiz.bank import ID_RE
from mpkit.quiz.store import ANSWERS, ResultStore, answers

MIME = "application/vnd.mpkit.quiz-answers+json"
FORMAT = "mpkit-quiz-answers"
VERSION = 1
HAND_IN_ID = "quiz_hand_in"  # the nbgrader grade_id of the hand-in cell
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # assignment names: nbgrader ids, file stems, tags


_quizzes = weakref.WeakSet()  # this kernel's assignment quizzes, to warn about unsubmitted answers


def track(quiz):
    """Remember an assignment quiz shown in this kernel (see :func:`hand_in`)."""
    _quizzes.add(quiz)


def unsubmitted(assignment):
    """How many exam quizzes of ``assignment`` in this kernel have answers chosen but not submitted."""
    return sum(q.assignment == assignment and q.mode == "exam" and not q.submitted
               and any(view.choice for view in q.views.values()) for q in list(_quizzes))


class AnswerSheetError(ValueError):
    """An answer sheet (or the notebook meant to carry one) that cannot be read."""


def check_assignment(name):
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ValueError(f"assignment must be a name of letters, digits, '_' or '-' like 'hw1', got {name!r}")
    return name


def build_sheet(assignment, item_ids, results):
    """The answer sheet of ``assignment`` from a results file's content."""
    recorded = answers(results, assignment)
    return {"format": FORMAT, "version": VERSION, "assignment": assignment, "items": list(item_ids),
            "answers": {item_id: recorded[item_id] for item_id in item_ids if recorded.get(item_id)}}


def check_sheet(sheet, where):
    """``sheet`` if it is a well-formed answer sheet; :class:`AnswerSheetError` says what is wrong."""
    if not isinstance(sheet, dict) or sheet.get("format") != FORMAT or sheet.get("version") != VERSION:
        raise AnswerSheetError(f"{where}: the answer sheet is not an mpkit answer sheet, version {VERSION}")
    items, recorded = sheet.get("items"), sheet.get("answers")
    if (not isinstance(items, list) or not all(isinstance(i, str) and ID_RE.fullmatch(i) for i in items)
            or not isinstance(recorded, dict)
            or not all(isinstance(v, list) and all(a in (*ANSWERS, None) for a in v) for v in recorded.values())):
        raise AnswerSheetError(f"{where}: the answer sheet needs an \"items\" list of ids and "
                               "\"answers\" mapping ids to lists of \"O\", \"X\" or null")
    return sheet


def sheet_in_cell(cell, where):
    """The answer sheet among a hand-in cell's outputs, None if it has none (the cell never ran)."""
    outputs = cell.get("outputs")
    sheets = [out["data"][MIME] for out in (outputs if isinstance(outputs, list) else ())
              if isinstance(out, dict) and isinstance(out.get("data"), dict) and MIME in out["data"]]
    return check_sheet(sheets[-1], where) if sheets else None


def hand_in_cell(notebook, where):
    """The notebook's hand-in cell (grade_id :data:`HAND_IN_ID`), None if it has none."""
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        raise AnswerSheetError(f"{where}: not a Jupyter notebook (no list of cells)")
    for cell in cells:
        meta = cell.get("metadata") if isinstance(cell, dict) else None
        nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
        if isinstance(nbgrader, dict) and nbgrader.get("grade_id") == HAND_IN_ID:
            return cell
    return None


class AnswerSheet:
    """Displays a sheet: an HTML table (answers only, no key) and the JSON graders read."""

    def __init__(self, sheet, lang="ko", unsubmitted=0, learner=None, login_only=False):
        self.sheet, self.lang, self.unsubmitted = sheet, check_lang(lang), unsubmitted
        # whose saved answers these are (shown, never part of the sheet: the submission says who
        # is graded); ``login_only``: the name is only the OS login, which learners may share
        self.learner, self.login_only = learner, login_only

    def _repr_mimebundle_(self, **kwargs):
        return {MIME: self.sheet, "text/html": self.html(), "text/plain": self.text()}

    def text(self):
        answered = sum(bool(self.sheet["answers"].get(i, [None])[0]) for i in self.sheet["items"])
        return " / ".join(t("sheet_answered", lang, answered=answered, total=len(self.sheet["items"]))
                          for lang in LANGS)

    def html(self):
        lang = self.lang
        rows = []
        for number, item_id in enumerate(self.sheet["items"], start=1):
            recorded = self.sheet["answers"].get(item_id, [])
            first = (recorded[0] or "–") if recorded else ""
            later = " ".join(a or "–" for a in recorded[1:])
            rows.append(f"<tr><td>{number}</td><td>{html.escape(item_id)}</td><td><b>{first}</b></td>"
                        f"<td>{later}</td></tr>")
        head = "".join(f"<th>{t(key, lang)}</th>" for key in ("sheet_item", "sheet_graded", "sheet_later"))
        warning = t("sheet_unsubmitted", lang, n=self.unsubmitted) if self.unsubmitted else ""
        warning = f"<p class=\"mpkit-answer-sheet-warning\"><b>{warning}</b></p>" if warning else ""
        whose = ""
        if self.learner is not None:
            name = html.escape(repr(self.learner))
            whose = t("sheet_whose", lang, name=name)
            if self.login_only:
                whose += " " + html.escape(t("sheet_login_only", lang, name=repr(self.learner)))
            whose = f"<p class=\"mpkit-answer-sheet-learner\">{whose}</p>"
        return (f"<div class=\"mpkit-answer-sheet\"><b>{t('sheet_title', lang)} · "
                f"{html.escape(self.sheet['assignment'])}</b> — {html.escape(self.text())}<br>{whose}"
                f"<table><tr><th>#</th>{head}</tr>{''.join(rows)}</table>"
                f"<p>{t('sheet_saved', lang)}</p>{warning}</div>")


def marked_html(marks, note=None):
    """The grader's per-item table (both languages): graded answer, key, retakes; for feedback."""
    def both(key, **values):
        return " / ".join(t(key, lang, **values) for lang in LANGS)

    lines = [both("sheet_score", correct=sum(m.correct for m in marks), total=len(marks))]
    retaken = sum(m.retaken for m in marks)
    if retaken:
        lines.append(both("sheet_retakes", n=retaken))
    if note:
        lines.append(html.escape(note))
    head = "".join(f"<th>{text}</th>" for text in
                   (both("sheet_item"), both("sheet_graded"), both("sheet_key"), "", both("sheet_later")))
    rows = "".join(f"<tr><td>{html.escape(m.item_id)}</td><td>{m.given or '–'}</td><td>{m.key}</td>"
                   f"<td>{'✔' if m.correct else '✘'}</td><td>{m.last or '–' if m.retaken else ''}</td></tr>"
                   for m in marks)
    return f"<div class=\"mpkit-quiz-marks\">{'<br>'.join(lines)}<table><tr>{head}</tr>{rows}</table></div>"


def answer_sheet(assignment, item_ids, lang="ko", student=None, results_dir=None):
    """The :class:`AnswerSheet` of ``assignment`` from this student's saved answers."""
    check_assignment(assignment)
    store = ResultStore(student, results_dir)
    login_only = student is None and not os.environ.get("MPKIT_STUDENT")
    return AnswerSheet(build_sheet(assignment, item_ids, store.data), lang, unsubmitted(assignment),
                       store.student, login_only)


def hand_in(assignment, item_ids, lang="ko", student=None, results_dir=None):
    """Show the answer sheet of ``assignment`` as this cell's output, so that saving the notebook
    saves the answers in it. Under nbgrader autograde the sheet of the *submitted* notebook is
    graded by :mod:`mpkit.quiz.nbgrader`, which replaces this cell's output; reaching this code
    there means those preprocessors are not configured, and the error says how to fix it."""
    if os.environ.get("NBGRADER_EXECUTION") == "autograde":
        raise RuntimeError("mpkit's nbgrader preprocessors are not configured, so the answers in the "
                           "submitted notebook were not graded. Add these two lines to nbgrader_config.py "
                           "and autograde again: from mpkit.quiz.nbgrader import configure; configure(c)")
    from IPython.display import display

    display(answer_sheet(assignment, item_ids, lang, student, results_dir))
