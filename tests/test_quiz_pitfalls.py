"""Quiz.pitfalls: the per-pitfall results shown after Submit, as data."""
from mpkit import quiz
from mpkit.quiz.widget import Score


def test_pitfalls_tally_matches_answers_and_the_table(tmp_path):
    q = quiz.show("all", mode="exam", n=12, shuffle=True, seed=3, student="t", results_dir=tmp_path)
    for item in q.items:
        q.answer(item.id, "O")
    q.submit()
    tally = q.pitfalls
    assert sum(s.total for s in tally.values()) == 12
    assert sum(s.correct for s in tally.values()) == q.score.correct == sum(i.answer == "O" for i in q.items)
    assert all(isinstance(s, Score) and 0 <= s.correct <= s.total for s in tally.values())
    assert list(tally) == list(dict.fromkeys(i.pitfall for i in q.items))   # item order
    bank = quiz.load_bank()
    for tag, score in tally.items():
        assert f"<td>{bank.pitfalls[tag]['ko']}</td><td>{score}</td>" in q.summary.value


def test_pitfalls_before_any_answer_are_all_zero(tmp_path):
    q = quiz.show(["ov-001", "ov-002"], mode="exam", student="t", results_dir=tmp_path)
    assert q.pitfalls == {"confuses-dp-with-mp": Score(0, 2)}
    assert list(tmp_path.iterdir()) == []   # nothing saved before an answer is taken
