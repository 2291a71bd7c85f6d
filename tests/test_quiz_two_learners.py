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
