"""The O/X quiz widget: ``quiz.show("pipeline")`` in a notebook, ``quiz.review()`` to drill misses.

State lives in plain Python (each item's choice and whether it is revealed); widget values are
re-rendered from that state and the current language, so a real button click, ``Quiz.answer()``
and the language toggle all take one path. Feedback is written into ``HTML`` widget values and
never printed through an ``Output`` widget, so what a cell prints does not depend on what was
clicked (the labs check their claims with asserts; nbval compares no printed output).

Every answer is recorded the moment its key is shown: a drill answer at once, an exam on Submit
(items left blank included), so graders can tell a first answer from a retake. While nbgrader
autogrades a notebook, quizzes keep answers in memory and never touch the grader's files.
"""
import html
import os
from collections import namedtuple

import ipywidgets as W

from mpkit.quiz.bank import ANSWERS, load_bank
from mpkit.quiz.handin import check_assignment, track
from mpkit.quiz.store import MemoryStore, ResultStore
from mpkit.i18n import LANG_LABELS, LANGS, check_lang, t

MODES = ("drill", "exam")


class Score(namedtuple("Score", "correct total")):
    """Correct answers out of the quiz's items; prints as ``7/10``."""

    def __str__(self):
        return f"{self.correct}/{self.total}"


class _ItemView:
    """The widgets of one item: statement, O and X buttons, feedback."""

    def __init__(self, item, number, on_click):
        self.item, self.number = item, number
        self.choice = None      # "O" / "X" once answered (exam: selected, may change until submit)
        self.revealed = False   # feedback shown (drill: after answering; exam: after submit)
        self.statement = W.HTML()
        self.buttons = {}
        for choice in ANSWERS:
            button = W.Button(description=choice, layout=W.Layout(width="4em"))
            button.add_class(f"mpkit-quiz-{choice.lower()}")
            button.on_click(lambda _button, choice=choice: on_click(item.id, choice))
            self.buttons[choice] = button
        self.feedback = W.HTML()
        self.feedback.add_class("mpkit-quiz-feedback")
        self.box = W.VBox([self.statement, W.HBox(list(self.buttons.values())), self.feedback])
        self.box.add_class("mpkit-quiz-item")
        self.box.add_class(f"mpkit-item-{item.id}")

    @property
    def correct(self):
        return self.choice == self.item.answer

    def render(self, lang, locked):
        self.statement.value = f"<b>{self.number}.</b> {html.escape(self.item.statement[lang])}"
        for choice, button in self.buttons.items():
            button.tooltip = t(f"{choice.lower()}_tooltip", lang)
            button.disabled = locked
            button.button_style = "info" if choice == self.choice else ""
        self.feedback.value = self._feedback(lang)

    def _feedback(self, lang):
        if not self.revealed:
            return f"{t('selected', lang)}: {self.choice}" if self.choice else ""
        verdict = t("unanswered" if self.choice is None else "correct" if self.correct else "incorrect", lang)
        given = f" · {t('your_answer', lang)}: {self.choice}" if self.choice else ""
        parts = [f"<b>{verdict}</b>{given} · {t('right_answer', lang)}: {self.item.answer}",
                 f"<b>{t('explanation', lang)}:</b> {html.escape(self.item.explanation[lang])}"]
        if self.item.corrected:
            parts.append(f"<b>{t('corrected', lang)}:</b> {html.escape(self.item.corrected[lang])}")
        return "<br>".join(parts)


class Quiz:
    """A displayable O/X quiz (the ipywidgets tree is ``.widget``).

    Use ``.answer(id, "O"|"X")`` (same path as a click), ``.set_lang("en")``, ``.submit()`` (exam),
    ``.score`` and ``.feedback`` (id -> feedback HTML) from code and tests.
    """

    def __init__(self, items, bank, *, lang, mode, store, assignment=None, exercises_passed=None):
        self.items, self.mode, self.lang, self.assignment = list(items), mode, lang, assignment
        self.exercises_passed = exercises_passed  # the review shows them; None elsewhere
        self.submitted = False
        self._bank, self._store = bank, store
        self.views = {item.id: _ItemView(item, number, self._on_click)
                      for number, item in enumerate(self.items, start=1)}
        self.title = W.HTML()
        self.lang_toggle = W.ToggleButtons(options=[(LANG_LABELS[code], code) for code in LANGS], value=lang)
        self.lang_toggle.add_class("mpkit-quiz-lang")
        self.lang_toggle.observe(self._on_toggle, names="value")
        self.score_html = W.HTML()
        self.score_html.add_class("mpkit-quiz-score")
        self.summary = W.HTML()
        self.summary.add_class("mpkit-quiz-summary")
        self.exercises = W.HTML()
        self.exercises.add_class("mpkit-quiz-exercises")
        self.notice = W.HTML()  # where answers go, after the kernel's first save: JupyterLab hides a click's print
        self.notice.add_class("mpkit-quiz-notice")
        self.submit_button = None
        children = [W.HBox([self.title, self.lang_toggle]), *(view.box for view in self.views.values())]
        if mode == "exam":
            self.submit_button = W.Button(icon="check")
            self.submit_button.add_class("mpkit-quiz-submit")
            self.submit_button.on_click(lambda _button: self.submitted or self._clicked(self._submit))
            children.append(self.submit_button)
        self.widget = W.VBox([*children, self.score_html, self.summary, self.exercises, self.notice])
        self.widget.add_class("mpkit-quiz")
        self.widget.add_class(f"mpkit-quiz-{mode}")
        if not self.items:
            self.widget.add_class("mpkit-quiz-empty")
        if assignment is not None:
            track(self)
        self._render()

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = repr(self)  # short and stable, unlike the widget tree's repr
        return bundle

    def __repr__(self):
        return f"<mpkit quiz: {len(self.items)} items, mode={self.mode}, lang={self.lang}>"

    @property
    def score(self):
        """:class:`Score` so far (drill) or after submit (exam; None before)."""
        if self.mode == "exam" and not self.submitted:
            return None
        return Score(sum(view.correct for view in self.views.values()), len(self.items))

    @property
    def pitfalls(self):
        """Pitfall tag -> :class:`Score` over this quiz's items, in item order (answered or not);
        the table shown after Submit."""
        tally = {}
        for view in self.views.values():
            right, total = tally.get(view.item.pitfall, (0, 0))
            tally[view.item.pitfall] = (right + view.correct, total + 1)
        return {tag: Score(right, total) for tag, (right, total) in tally.items()}

    @property
    def feedback(self):
        """Item id -> the current value of its feedback widget."""
        return {item_id: view.feedback.value for item_id, view in self.views.items()}

    def answer(self, item_id, choice):
        """Answer one item exactly as clicking its O/X button would; ValueError if it cannot be taken."""
        if item_id not in self.views:
            raise ValueError(f"item {item_id!r} is not in this quiz; its items: {', '.join(self.views)}")
        if choice not in ANSWERS:
            raise ValueError(f'answer with "O" (true) or "X" (false), got {choice!r}')
        refused = self._accept(item_id, choice)
        if refused:
            raise ValueError(refused)

    def set_lang(self, lang):
        """Switch every statement, tooltip, feedback and UI string to ``lang`` ("ko" or "en")."""
        self.lang = check_lang(lang)
        self.lang_toggle.value = lang  # its observer sees no change of language and does nothing
        self._render()

    def submit(self):
        """Exam mode: record the answers, reveal feedback, score and per-pitfall summary."""
        if self.mode != "exam":
            raise ValueError("submit() is for mode='exam'; in drill mode every answer is checked at once")
        if self.submitted:
            raise ValueError("this quiz is already submitted; run the cell again to retake it")
        self._submit()

    def _on_toggle(self, change):
        if change["new"] != self.lang:
            self.set_lang(change["new"])

    def _on_click(self, item_id, choice):
        self._clicked(self._accept, item_id, choice)  # a click on a locked item is simply ignored

    def _clicked(self, action, *args):
        """Run a click's action; an answer that could not be saved (a full disk, a folder that cannot be
        written) is said in the widget, since nobody sees what a click's callback raises."""
        try:
            action(*args)
        except (OSError, ValueError) as exc:
            error = html.escape(str(exc))
            self.notice.value = "<br>".join(f"<b>{t('not_saved', lang, error=error)}</b>" for lang in LANGS)

    def _accept(self, item_id, choice):
        """Take the answer, or return why not (the buttons are disabled in those cases)."""
        view = self.views[item_id]
        if self.submitted:
            return "this quiz is already submitted; run the cell again to retake it"
        if self.mode == "drill":
            if view.revealed:
                return f"{item_id} is already answered; run the cell again (or quiz.review()) to retry"
            self._saved(self._store.record([(item_id, choice, choice == view.item.answer)], lang=self.lang,
                                           mode="drill", assignment=self.assignment))
            view.revealed = True
        view.choice = choice
        self._render()
        return None

    def _submit(self):
        if self.items:  # blanks too: Submit shows their key as well
            answers = [(view.item.id, view.choice, view.correct) for view in self.views.values()]
            self._saved(self._store.record(answers, lang=self.lang, mode="exam", assignment=self.assignment))
        self.submitted = True
        for view in self.views.values():
            view.revealed = True
        self._render()

    def _saved(self, notice):
        if notice:
            self.notice.value = "<br>".join(map(html.escape, notice.splitlines()))

    def _render(self):
        lang = self.lang
        topics = {item.topic for item in self.items}
        name = self._bank.titles[topics.pop()][lang] if len(topics) == 1 else None
        self.title.value = f"<b>{t('title', lang)}{' · ' + html.escape(name) if name else ''}</b>"
        self.lang_toggle.tooltip = t("lang_tooltip", lang)
        for view in self.views.values():
            view.render(lang, locked=self.submitted or (self.mode == "drill" and view.revealed))
        if self.submit_button is not None:
            self.submit_button.description = t("submit", lang)
            self.submit_button.tooltip = t("submit_tooltip", lang)
            self.submit_button.disabled = self.submitted
        if not self.items:
            self.score_html.value = (f"{html.escape(t('review_empty', 'ko'))}<br>"
                                     f"{html.escape(t('review_empty', 'en'))}")
        elif self.mode == "drill":
            answered = sum(view.revealed for view in self.views.values())
            self.score_html.value = f"{t('progress', lang)}: {self.score.correct} / {answered} / {len(self.items)}"
        else:
            self.score_html.value = f"<b>{t('score', lang)}: {self.score}</b>" if self.submitted else ""
        self.summary.value = self._pitfall_table(lang) if self.submitted else ""
        if self.exercises_passed is not None:
            names = ", ".join(self.exercises_passed) or t("exercises_none", lang)
            self.exercises.value = f"{t('exercises_passed', lang)}: {html.escape(names)}"

    def _pitfall_table(self, lang):
        rows = "".join(f"<tr><td>{html.escape(self._bank.pitfalls[tag][lang])}</td>"
                       f"<td>{score}</td></tr>" for tag, score in self.pitfalls.items())
        return (f"<table><tr><th>{t('pitfall', lang)}</th><th>{t('pitfall_result', lang)}</th></tr>"
                f"{rows}</table>")


def _check_mode(mode):
    if mode not in MODES:
        raise ValueError(f"mode must be 'drill' (feedback at once) or 'exam' (feedback after Submit), "
                         f"got {mode!r}")


def _open_store(student, results_dir):
    if os.environ.get("NBGRADER_EXECUTION") == "autograde":
        return MemoryStore()
    return ResultStore(student, results_dir)


def show(topic_or_ids, lang="ko", mode="drill", n=None, shuffle=False, seed=None,
         student=None, results_dir=None, bank_dir=None, assignment=None):
    """An O/X quiz over a topic, ``"all"``, or a list of item ids; answers are saved per student
    (tagged with ``assignment`` in assignment notebooks, for :func:`mpkit.quiz.hand_in`)."""
    check_lang(lang)
    _check_mode(mode)
    if assignment is not None:
        check_assignment(assignment)
    bank = load_bank(bank_dir)
    items = bank.select(topic_or_ids, n=n, shuffle=shuffle, seed=seed)
    return Quiz(items, bank, lang=lang, mode=mode, store=_open_store(student, results_dir), assignment=assignment)


def review(lang="ko", n=10, student=None, results_dir=None, bank_dir=None):
    """Drill the items this student missed, lowest Leitner box first (never-answered items are not
    missed); with nothing to review the quiz shows a short bilingual message instead. Below, the
    exercises (``mpkit.exercises``) this student has passed."""
    check_lang(lang)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a whole number of items, 1 or more, got {n!r}")
    bank = load_bank(bank_dir)
    store = _open_store(student, results_dir)
    ids = [item_id for item_id in store.missed() if item_id in bank.items][:n]
    passed = [name for name, entry in store.data.get("exercises", {}).items() if entry["passed"]]
    return Quiz(bank.select(ids) if ids else [], bank, lang=lang, mode="drill", store=store, exercises_passed=passed)
