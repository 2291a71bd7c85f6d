"""Two learners under one OS account (a shared lab PC): answers are saved per learner name, which
is the login unless MPKIT_STUDENT or ``student=`` says otherwise. The hand-in shows whose answers
it holds and, when the name is only the login, how to set one's own (issue 36: the second
learner's hand-in silently showed the first learner's answers)."""
import getpass
import html

import pytest

from mpkit.quiz.handin import answer_sheet
from mpkit.quiz.store import ResultStore


@pytest.fixture
def shared_pc(tmp_path, monkeypatch):
    monkeypatch.delenv("MPKIT_STUDENT", raising=False)
    return tmp_path / "store"


def _answer(folder, item, choice):
    ResultStore(None, folder).record([(item, choice, True)], lang="en", mode="exam", assignment="hw1")


def test_the_login_name_alone_is_said_and_the_fix_given(shared_pc):
    _answer(shared_pc, "mp-001", "O")   # the first learner, under the login
    sheet = answer_sheet("hw1", ["mp-001"], lang="en", results_dir=shared_pc)   # the second one's hand-in
    shown = html.unescape(sheet.html())
    assert f"These are the answers of learner {getpass.getuser()!r}." in shown
    assert "is this computer's login name. If several learners share this account" in shown
    assert "%env MPKIT_STUDENT=<your id>" in shown


def test_each_learner_who_names_themselves_sees_only_their_answers(shared_pc, monkeypatch):
    monkeypatch.setenv("MPKIT_STUDENT", "kim")
    _answer(shared_pc, "mp-001", "O")
    monkeypatch.setenv("MPKIT_STUDENT", "lee")
    lee = answer_sheet("hw1", ["mp-001"], lang="en", results_dir=shared_pc)
    assert lee.sheet["answers"] == {}
    assert "learner 'lee'" in html.unescape(lee.html()) and "login name" not in lee.html()
    kim = answer_sheet("hw1", ["mp-001"], lang="en", student="kim", results_dir=shared_pc)
    assert kim.sheet["answers"] == {"mp-001": ["O"]}
    assert "learner" not in str(kim.sheet)   # the graded sheet still holds no name


def test_autograde_warns_when_a_graded_submission_is_replaced(tmp_path):
    """On one OS account `nbgrader submit --student kim` by anyone replaces kim's work after
    `collect --update`; nbgrader regrades it without a word of who submitted. mpkit says so."""
    import datetime
    import logging

    from nbgrader.api import Gradebook

    from mpkit.quiz.nbgrader import CollectQuizAnswers
    from test_nbgrader import _assignment, _sheet

    db = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with Gradebook(db) as gradebook:
        gradebook.add_assignment("hw1")
        gradebook.add_student("kim")
        gradebook.add_submission("hw1", "kim", timestamp=datetime.datetime(2026, 12, 1, 9, 0))
    resources = {"nbgrader": {"db_url": db, "assignment": "hw1", "student": "kim", "notebook": "hw1"}}
    pre = CollectQuizAnswers()
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    pre.log.addHandler(handler)
    try:
        pre.preprocess(_assignment(_sheet({})), resources)       # graded once
        pre.preprocess(_assignment(_sheet({})), resources)       # the same submission again: fine
        assert not [r for r in records if "was replaced" in r.getMessage()]
        with Gradebook(db) as gradebook:
            gradebook.update_or_create_submission("hw1", "kim", timestamp=datetime.datetime(2026, 12, 2, 9, 0))
        pre.preprocess(_assignment(_sheet({})), resources)       # collect --update brought another one
    finally:
        pre.log.removeHandler(handler)
    replaced = [r.getMessage() for r in records if "was replaced" in r.getMessage()]
    assert len(replaced) == 1 and "nbgrader submit --student kim" in replaced[0]
    assert ("kim's graded submission of hw1 (submitted 2026-12-01T09:00:00) was replaced by one submitted "
            "2026-12-02T09:00:00") in replaced[0]
