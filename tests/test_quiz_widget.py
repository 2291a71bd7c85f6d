"""The quiz widget driven headless: real button clicks and .answer(), both languages, both modes."""
from pathlib import Path

import ipywidgets as W
import pytest

from mpkit import quiz
from mpkit.quiz.store import read_results

GOOD = Path(__file__).parent / "fixtures" / "quiz" / "good"


@pytest.fixture
def make(tmp_path):
    def make_quiz(topic_or_ids="model_parallel", **kwargs):
        kwargs.setdefault("student", "kim")
        return quiz.show(topic_or_ids, bank_dir=GOOD, results_dir=tmp_path, **kwargs)
    make_quiz.results_dir = tmp_path
    make_quiz.results = lambda student="kim": read_results(tmp_path / f"{student}.json")
    return make_quiz


def classes(widget):
    return set(widget._dom_classes)


def test_structure_css_classes_and_buttons(make):
    q = make()
    assert isinstance(q.widget, W.VBox) and {"mpkit-quiz", "mpkit-quiz-drill"} <= classes(q.widget)
    assert [item.id for item in q.items] == ["mp-001", "mp-002", "mp-003", "mp-004"]
    view = q.views["mp-002"]
    assert {"mpkit-quiz-item", "mpkit-item-mp-002"} <= classes(view.box)
    assert view.box in q.widget.children
    o, x = view.buttons["O"], view.buttons["X"]
    assert (o.description, x.description) == ("O", "X")
    assert "mpkit-quiz-o" in classes(o) and "mpkit-quiz-x" in classes(x)
    assert o.tooltip == "O: 맞는 설명이다 (참)" and x.tooltip == "X: 틀린 설명이다 (거짓)"
    assert "mpkit-quiz-feedback" in classes(view.feedback) and view.feedback.value == ""
    assert "mpkit-quiz-lang" in classes(q.lang_toggle) and q.lang_toggle._options_labels == ("한국어", "English")
    assert "mpkit-quiz-score" in classes(q.score_html)
    assert q.submit_button is None
    assert "모델의 파라미터를 여러 장치로" in q.views["mp-001"].statement.value
    bundle = q._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == "<mpkit quiz: 4 items, mode=drill, lang=ko>"


def test_drill_click_gives_text_feedback_and_records(make):
    q = make()
    q.views["mp-002"].buttons["X"].click()             # a real click
    fb = q.feedback["mp-002"]
    assert "✔ 정답입니다" in fb and "내 답: X" in fb and "정답: X" in fb
    assert "데이터를 나누는 것은 데이터 병렬화이다." in fb
    assert "바르게 고친 문장:</b> 모델 병렬화는 모델을 여러 장치로" in fb
    q.answer("mp-001", "X")                            # the programmatic path
    fb = q.feedback["mp-001"]
    assert "✘ 오답입니다" in fb and "정답: O" in fb and "바르게 고친" not in fb
    assert q.views["mp-001"].buttons["O"].disabled and q.views["mp-001"].buttons["X"].disabled
    assert not q.views["mp-003"].buttons["O"].disabled
    assert q.score == (1, 4) and str(q.score) == "1/4"
    assert q.score_html.value.endswith("1 / 2 / 4")
    saved = make.results()["items"]
    assert (saved["mp-002"]["answer"], saved["mp-002"]["correct"], saved["mp-002"]["history"][0]["mode"]) == \
        ("X", True, "drill")
    assert (saved["mp-001"]["answer"], saved["mp-001"]["box"]) == ("X", 1)


def test_a_click_whose_answer_cannot_be_saved_says_so_in_the_widget(tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("", encoding="utf-8")        # the results folder cannot be made: a file is there
    for mode in ("drill", "exam"):
        q = quiz.show("model_parallel", bank_dir=GOOD, results_dir=blocked, student="kim", mode=mode, lang="en")
        q.views["mp-001"].buttons["O"].click()
        if mode == "exam":
            q.submit_button.click()
        assert "Your answer was not saved:" in q.notice.value and "답을 저장하지 못했습니다" in q.notice.value
        assert not q.views["mp-001"].revealed and not q.submitted   # nothing shown as if it were saved
        with pytest.raises(OSError):                                # the programmatic path raises as before
            q.answer("mp-001", "O") if mode == "drill" else q.submit()


def test_drill_item_is_answered_once(make):
    q = make()
    q.answer("mp-001", "O")
    q.views["mp-001"].buttons["X"].click()  # ignored: buttons are disabled, the click changes nothing
    assert "✔ 정답입니다" in q.feedback["mp-001"]
    with pytest.raises(ValueError, match="mp-001 is already answered; run the cell again"):
        q.answer("mp-001", "X")
    assert len(make.results()["items"]["mp-001"]["history"]) == 1


def test_language_toggle_switches_everything(make):
    q = make(mode="exam")
    q.answer("mp-002", "X")
    q.lang_toggle.value = "en"                         # what clicking "English" does
    assert q.lang == "en"
    assert q.views["mp-002"].statement.value.endswith("Model parallelism splits the data across devices "
                                                      "and processes it in parallel.")
    assert q.views["mp-002"].buttons["O"].tooltip == "O: the statement is true"
    assert q.feedback["mp-002"] == "Selected: X"
    assert q.submit_button.description == "Submit"
    assert q.title.value == "<b>O/X quiz · Model parallelism</b>"
    q.submit()
    assert "✔ Correct" in q.feedback["mp-002"] and "Corrected statement" in q.feedback["mp-002"]
    assert "Score: 1/4" in q.score_html.value and "Confusing data with model parallelism" in q.summary.value
    q.set_lang("ko")
    assert q.lang_toggle.value == "ko"
    assert "✔ 정답입니다" in q.feedback["mp-002"] and "점수: 1/4" in q.score_html.value
    assert "데이터 병렬화와 모델 병렬화 혼동" in q.summary.value and "Confusing" not in q.summary.value
    assert "모델 병렬화는 데이터를" in q.views["mp-002"].statement.value


def test_exam_hides_feedback_until_submit_then_scores_per_pitfall(make, tmp_path):
    q = make(["mp-001", "mp-002", "mp-003", "pp-001"], mode="exam")
    assert {"mpkit-quiz-exam"} <= classes(q.widget) and "mpkit-quiz-submit" in classes(q.submit_button)
    q.views["mp-001"].buttons["X"].click()
    q.views["mp-001"].buttons["O"].click()             # may change its mind before submitting
    q.answer("mp-002", "O")
    q.answer("pp-001", "O")
    assert q.feedback["mp-001"] == "선택: O" and q.views["mp-001"].buttons["O"].button_style == "info"
    assert not any("정답" in value for value in q.feedback.values())
    assert q.score is None and q.score_html.value == "" and q.summary.value == ""
    assert not (tmp_path / "kim.json").exists()        # exam answers are recorded on submit
    q.submit_button.click()
    assert q.score == (2, 4) and "점수: 2/4" in q.score_html.value
    assert "✔ 정답입니다" in q.feedback["mp-001"] and "✘ 오답입니다" in q.feedback["mp-002"]
    assert "답하지 않았습니다" in q.feedback["mp-003"]
    summary = q.summary.value
    assert "<td>데이터 병렬화와 모델 병렬화 혼동</td><td>1/2</td>" in summary
    assert "<td>모델 분할 기준 오해</td><td>0/1</td>" in summary
    assert "<td>파이프라인 버블 공식</td><td>1/1</td>" in summary
    assert q.submit_button.disabled and all(b.disabled for v in q.views.values() for b in v.buttons.values())
    saved = make.results()["items"]
    assert set(saved) == {"mp-001", "mp-002", "mp-003", "pp-001"}  # the blank too: Submit showed its key
    assert [h["answer"] for h in saved["mp-001"]["history"]] == ["O"]
    assert saved["mp-003"]["answer"] is None and saved["mp-003"]["box"] == 1
    assert saved["mp-002"]["history"][0]["mode"] == "exam"
    with pytest.raises(ValueError, match="already submitted"):
        q.submit()
    with pytest.raises(ValueError, match="already submitted"):
        q.answer("mp-003", "O")


def test_earlier_answers_are_kept_by_a_recreated_widget(make):
    make().answer("mp-001", "X")
    q2 = make()                                        # the cell is run again
    assert q2.feedback["mp-001"] == ""                 # a fresh attempt ...
    q2.answer("mp-001", "O")
    history = make.results()["items"]["mp-001"]["history"]
    assert [h["answer"] for h in history] == ["X", "O"]  # ... that keeps the earlier one


def test_review_drills_missed_items_lowest_box_first(make):
    q = make("all")
    for item_id, answer in [("mp-001", "X"), ("mp-002", "X"), ("mp-003", "X"), ("pp-001", "X")]:
        q.answer(item_id, answer)                      # mp-001, mp-003, pp-001 wrong; mp-002 right
    q2 = make("all")
    q2.answer("mp-003", "O")                           # mp-003 now right: box 2
    review = quiz.review(lang="en", bank_dir=GOOD, results_dir=make.results_dir, student="kim")
    assert [item.id for item in review.items] == ["mp-001", "pp-001", "mp-003"]
    assert review.mode == "drill" and review.lang == "en"
    review.answer("mp-001", "O")
    assert make.results()["items"]["mp-001"]["box"] == 2
    assert [i.id for i in quiz.review(n=1, bank_dir=GOOD, results_dir=make.results_dir, student="kim").items] \
        == ["pp-001"]


def test_review_with_nothing_missed_shows_a_bilingual_message(make):
    make().answer("mp-001", "O")
    review = quiz.review(bank_dir=GOOD, results_dir=make.results_dir, student="kim")
    assert review.items == [] and "mpkit-quiz-empty" in classes(review.widget)
    assert "복습할 문항이 없습니다" in review.score_html.value and "Nothing to review yet" in review.score_html.value
    assert "Nothing to review" in quiz.review(bank_dir=GOOD, results_dir=make.results_dir,
                                              student="never-answered").score_html.value


@pytest.mark.parametrize("kwargs, message", [
    ({"lang": "kr"}, "lang must be one of 'ko', 'en', got 'kr'"),
    ({"mode": "test"}, "mode must be 'drill' (feedback at once) or 'exam'"),
    ({"n": 0}, "n must be a whole number from 1 to 4"),
    ({"n": 5}, "n must be a whole number from 1 to 4"),
])
def test_show_rejects_bad_arguments(make, kwargs, message):
    with pytest.raises(ValueError) as err:
        make(**kwargs)
    assert message in str(err.value)


def test_bad_answers_and_review_args(make):
    q = make()
    with pytest.raises(ValueError, match="item 'pp-001' is not in this quiz"):
        q.answer("pp-001", "O")
    with pytest.raises(ValueError, match='answer with "O" \\(true\\) or "X" \\(false\\), got \'o\''):
        q.answer("mp-001", "o")
    with pytest.raises(ValueError, match="submit\\(\\) is for mode='exam'"):
        q.submit()
    with pytest.raises(ValueError, match="lang must be one of"):
        q.set_lang("fr")
    with pytest.raises(ValueError, match="n must be a whole number of items"):
        quiz.review(n=0, bank_dir=GOOD, results_dir=make.results_dir)


def test_statements_are_html_escaped(tmp_path):
    bank = tmp_path / "bank"
    bank.mkdir()
    (bank / "pitfalls.yaml").write_text((GOOD / "pitfalls.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    (bank / "pipeline.yaml").write_text(
        (GOOD / "pipeline.yaml").read_text(encoding="utf-8").replace("(p-1)/(m+p-1)", "<b>p < m</b>"),
        encoding="utf-8")
    q = quiz.show("pipeline", bank_dir=bank, results_dir=tmp_path, student="kim")
    assert "&lt;b&gt;p &lt; m&lt;/b&gt;" in q.views["pp-001"].statement.value


def test_assignment_answers_are_tagged(make):
    q = make(["mp-001", "mp-002"], mode="exam", assignment="hw1")
    q.answer("mp-001", "O")
    q.submit()
    make().answer("mp-002", "X")                        # practice outside the assignment
    history = make.results()["items"]
    assert [h.get("assignment") for h in history["mp-001"]["history"]] == ["hw1"]
    assert [h.get("assignment") for h in history["mp-002"]["history"]] == ["hw1", None]
    with pytest.raises(ValueError, match="assignment must be a name of letters"):
        make(assignment="hw 1")


def test_under_nbgrader_autograde_nothing_is_read_or_written(make, monkeypatch):
    """The grader's machine runs the student's notebook: its own results must stay untouched."""
    make().answer("mp-001", "X")
    before = make.results()
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    q = make(mode="exam")
    q.answer("mp-001", "O")
    q.submit()
    assert q.score == (1, 4)
    assert quiz.review(bank_dir=GOOD, results_dir=make.results_dir, student="kim").items == []
    assert make.results() == before


def test_the_kernels_first_save_shows_where_answers_go(tmp_path, monkeypatch, capsys):
    """A click's print goes to JupyterLab's log, so the quiz itself says it too."""
    from mpkit.quiz import store

    monkeypatch.delenv("MPKIT_RESULTS_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setattr(store, "_announced", False)
    q = quiz.show("model_parallel", bank_dir=GOOD, student="kim")
    assert q.notice.value == ""
    q.views["mp-001"].buttons["O"].click()
    path = tmp_path / "mpkit" / "quiz_results" / "kim.json"
    assert q.notice.value == (f"퀴즈 답안 저장 위치: {path} (다른 폴더를 쓰려면 MPKIT_RESULTS_DIR를 설정하세요)<br>"
                              f"Quiz answers are saved in {path} (set MPKIT_RESULTS_DIR to use another folder)")
    assert str(path) in capsys.readouterr().out and path.exists()
    q2 = quiz.show("model_parallel", bank_dir=GOOD, student="kim")
    q2.answer("mp-002", "X")
    assert q2.notice.value == "" and capsys.readouterr().out == ""


def test_the_hand_in_warns_about_answers_not_submitted(make):
    from mpkit.quiz.handin import answer_sheet

    q = make(["mp-001", "mp-002"], mode="exam", assignment="hw1")
    make(["mp-003"], mode="exam", assignment="hw2").answer("mp-003", "O")   # another assignment: not counted
    q.answer("mp-001", "O")
    sheet = answer_sheet("hw1", ["mp-001", "mp-002"], lang="en", student="kim", results_dir=make.results_dir)
    assert "1 quiz(zes) have answers chosen but not submitted: press Submit" in sheet.html()
    assert sheet.sheet["answers"] == {}
    q.submit()
    sheet = answer_sheet("hw1", ["mp-001", "mp-002"], lang="en", student="kim", results_dir=make.results_dir)
    assert "not submitted" not in sheet.html() and sheet.sheet["answers"] == {"mp-001": ["O"], "mp-002": [None]}
    assert sheet.text() == "2문항 중 1문항에 답함 / answered 1 of 2 items"
