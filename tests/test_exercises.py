"""The exercise checker: every reference solution passes every case within the time a learner
waits, a stub is "not done yet", a crash shows the learner's own lines, a deadlock ends (as soon as no
rank can go on; a loop at the timeout) with what each rank waited on, results land in the learner's
results file, and bad calls are refused.

The wrong and unusual-but-correct solutions live in tests/exercise_attempts/ (one module per
exercise, written without reading the references) and are run by test_exercise_attempts.py.
"""
import json
import time

import pytest
import torch
import torch.distributed as dist

from mpkit import exercises
from mpkit.exercises import EXERCISES, harness, solutions
from mpkit.exercises.progress import passed_exercises


def target(name):
    objs = solutions.definitions(EXERCISES[name])
    return objs[0] if len(objs) == 1 else tuple(objs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(EXERCISES))
def test_reference_solution_passes_every_case(name, tmp_path):
    started = time.monotonic()
    result = exercises.check(name, target(name), lang="en", results_dir=tmp_path, student="ref")
    assert result.passed, result.message
    assert result.score == (len(EXERCISES[name].cases),) * 2
    # each check finishes well within the 10 s a learner waits (a few launches of <= 4 ranks); the
    # bound is loose because CI's 2 cores are shared
    assert time.monotonic() - started < 30


def test_at_least_twelve_exercises_cover_the_labs():
    assert len(EXERCISES) >= 12
    assert {ex.lab for ex in EXERCISES.values()} >= {"01", "02", "03", "04", "05", "06", "10"}
    for ex in EXERCISES.values():
        assert len(ex.hints) == 3 and all(h.ko and h.en for h in ex.hints), ex.name
        assert len(ex.cases) >= 2 and "NotImplementedError" in ex.stub, ex.name


def test_untouched_stub_is_not_done_and_records_nothing(tmp_path):
    namespace = {}
    exec(EXERCISES["ring_all_reduce"].stub, namespace)
    result = exercises.check("ring_all_reduce", namespace["ring_all_reduce"], lang="en", results_dir=tmp_path)
    assert result.not_done and not result.passed and "not done yet" in result.message
    assert not list(tmp_path.glob("*.json"))


def test_crash_shows_the_learners_lines_not_mpkits(tmp_path):
    def ring_all_reduce(ctx, tensor):
        return tensor.view(7, -1)   # the learner's mistake
    result = exercises.check("ring_all_reduce", ring_all_reduce, lang="en", record=False)
    message = result.cases[0].detail("en")
    assert "rank" in message and "return tensor.view(7, -1)" in message and "RuntimeError" in message
    assert "mpkit/" not in message and "torch/" not in message


@pytest.mark.timeout(60)
def test_deadlock_ends_as_soon_as_no_rank_can_go_on_naming_what_each_rank_waited_on():
    def ring_all_reduce(ctx, tensor):
        dist.send(tensor, (ctx.rank + 1) % ctx.world_size)
        dist.recv(tensor, (ctx.rank - 1) % ctx.world_size)
        return tensor
    started = time.monotonic()
    result = exercises.check("ring_all_reduce", ring_all_reduce, lang="en", record=False)
    assert time.monotonic() - started < 3  # not the 6 s timeout: every rank is blocked in a send nobody receives
    first = result.cases[0].message("en")
    assert "rank 0: send to rank 1" in first and "rank 1: send to rank 0" in first and "deadlock" in first
    assert all("not run" in case.detail("en") for case in result.cases[1:])


def _late_sender(ctx):
    if ctx.rank == 0:
        time.sleep(2)  # rank 1 waits in its recv all this time, rank 0 runs: not a deadlock
        dist.send(torch.ones(3), 1)
        return None
    got = torch.zeros(3)
    dist.recv(got, 0)
    return got


@pytest.mark.timeout(60)
def test_a_slow_rank_is_not_a_deadlock_and_an_endless_loop_ends_at_the_timeout():
    out = harness.run(lambda ctx, recorder: recorder.call(_late_sender, ctx), 2, timeout=6)
    assert out[1]["out"].tolist() == [1.0, 1.0, 1.0]

    def rank_coordinates(rank, dp, pp, tp):
        while True:
            pass
    started = time.monotonic()
    result = exercises.check("rank_coordinates", rank_coordinates, lang="en", record=False, timeout=2)
    assert time.monotonic() - started >= 2
    assert not result.passed and "loop" in result.cases[0].message("en")


def test_checks_are_recorded_in_the_results_file(tmp_path):
    exercises.check("memory_per_gpu", solutions.memory_per_gpu, results_dir=tmp_path, student="kim")
    exercises.check("process_groups", lambda dp, pp, tp: {}, results_dir=tmp_path, student="kim")
    data = json.loads((tmp_path / "kim.json").read_text(encoding="utf-8"))
    assert data["exercises"]["memory_per_gpu"]["passed"] is True
    assert data["exercises"]["process_groups"]["passed"] is False
    assert data["exercises"]["process_groups"]["history"][0]["score"] == [0, 4]
    assert passed_exercises(student="kim", results_dir=tmp_path) == ["memory_per_gpu"]


def test_messages_come_in_both_languages():
    def memory_per_gpu(params, dp, pp, tp, zero_stage):
        return 16 * params
    ko = exercises.check("memory_per_gpu", memory_per_gpu, lang="ko", record=False).message
    en = exercises.check("memory_per_gpu", memory_per_gpu, lang="en", record=False).message
    assert "통과" in ko and "기댓값" in ko and "passed" in en and "expected" in en


def test_bad_calls_are_refused_with_what_to_change():
    with pytest.raises(ValueError, match="unknown; use one of"):
        exercises.check("ring_allreduce", solutions.ring_all_reduce)
    with pytest.raises(TypeError, match="pass the function you wrote"):
        exercises.check("ring_all_reduce", None)
    with pytest.raises(ValueError, match="lang"):
        exercises.check("ring_all_reduce", solutions.ring_all_reduce, lang="fr")


def test_review_lists_the_exercises_passed(tmp_path):
    from mpkit import quiz
    assert "none yet" in quiz.review(lang="en", student="lee", results_dir=tmp_path).exercises.value
    exercises.check("memory_per_gpu", solutions.memory_per_gpu, results_dir=tmp_path, student="lee")
    view = quiz.review(lang="ko", student="lee", results_dir=tmp_path)
    assert "통과한 연습" in view.exercises.value and "memory_per_gpu" in view.exercises.value


def _write_checks(args):
    folder, writer = args
    from mpkit.exercises.result import CaseResult, CheckResult, Text
    from mpkit.exercises.progress import record_check
    from mpkit.quiz.store import ResultStore
    for i in range(10):
        result = CheckResult(f"ex{writer}", "en", [CaseResult(Text("a", "a"), i % 2 == 0)])
        record_check(result, student="kim", results_dir=folder)
        ResultStore("kim", folder).record([(f"mp-{writer}{i:02d}", "O", True)], lang="en", mode="drill")


def test_exercise_checks_and_quiz_answers_from_concurrent_writers_are_all_kept(tmp_path):
    import multiprocessing
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(_write_checks, [(str(tmp_path), w) for w in range(4)])
    data = json.loads((tmp_path / "kim.json").read_text(encoding="utf-8"))
    assert sorted(data["exercises"]) == ["ex0", "ex1", "ex2", "ex3"]
    assert all(len(e["history"]) == 10 and e["passed"] for e in data["exercises"].values())
    assert len(data["items"]) == 40


def test_a_hostile_exercises_entry_is_moved_aside_not_trusted(tmp_path):
    (tmp_path / "kim.json").write_text(json.dumps({"format": "mpkit-quiz-results", "version": 2, "student": "kim",
                                                   "items": {}, "exercises": {"ring_all_reduce": "yes"}}))
    with pytest.warns(UserWarning, match="exercises"):
        exercises.check("memory_per_gpu", solutions.memory_per_gpu, results_dir=tmp_path, student="kim")
    assert list(tmp_path.glob("kim.json.corrupt-*"))
    assert json.loads((tmp_path / "kim.json").read_text())["exercises"]["memory_per_gpu"]["passed"] is True


def test_exercise_texts_use_the_glossary():
    from pathlib import Path

    from mpkit.quiz import glossary
    terms = glossary.load(Path(__file__).resolve().parents[1] / "quizzes" / glossary.GLOSSARY_FILE)
    for ex in EXERCISES.values():
        texts = [ex.title, *ex.hints, *(case.name for case in ex.cases)]
        for lang in ("ko", "en"):
            words = "\n".join(text(lang) for text in texts) + ("\n" + ex.stub if lang == "ko" else "")
            assert not glossary.variants(words, lang, terms), (ex.name, lang, glossary.variants(words, lang, terms))


def test_cli_lists_exercises_and_refuses_bad_assignments(tmp_path, capsys):
    from mpkit.cli import main
    assert main(["exercise", "list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in EXERCISES)
    assert main(["exercise", "assign", "--exercises", "ring_allreduce", "--out", str(tmp_path / "a.ipynb")]) == 2
    assert "unknown; use one of" in capsys.readouterr().err
    assert main(["exercise", "assign", "--exercises", "zero1_step,zero1_step", "--out", str(tmp_path / "a.ipynb")]) == 2
    assert "twice" in capsys.readouterr().err
    assert main(["exercise", "assign", "--exercises", "zero1_step", "--out", str(tmp_path / "a.txt")]) == 2
    assert ".ipynb" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
