"""Results store: atomic writes, nothing lost on corrupt files, history and Leitner boxes."""
import json
import os

import pytest

from mpkit.quiz import store as store_module
from mpkit.quiz.store import FORMAT, ResultStore, ResultsFileError, read_results, results_path, safe_filename


def test_record_appends_history_and_survives_a_new_store(tmp_path):
    first = ResultStore("kim", tmp_path)
    first.record([("pp-001", "O", True)], lang="ko", mode="drill")
    again = ResultStore("kim", tmp_path)  # a re-run cell / restarted kernel
    again.record([("pp-001", "X", False), ("pp-002", "O", True)], lang="en", mode="exam")
    data = json.loads((tmp_path / "kim.json").read_text(encoding="utf-8"))
    assert (data["format"], data["version"], data["student"]) == (FORMAT, 1, "kim")
    entry = data["items"]["pp-001"]
    assert [(h["answer"], h["correct"], h["lang"], h["mode"]) for h in entry["history"]] == \
        [("O", True, "ko", "drill"), ("X", False, "en", "exam")]
    assert (entry["answer"], entry["correct"], entry["at"]) == ("X", False, entry["history"][-1]["at"])
    assert entry["history"][0]["session"] != entry["history"][1]["session"]
    assert data["items"]["pp-002"]["answer"] == "O"


def test_two_open_stores_for_one_student_keep_each_others_answers(tmp_path):
    a, b = ResultStore("kim", tmp_path), ResultStore("kim", tmp_path)
    a.record([("pp-001", "O", True)], lang="ko", mode="drill")
    b.record([("pp-002", "X", True)], lang="ko", mode="drill")
    assert set(read_results(tmp_path / "kim.json")["items"]) == {"pp-001", "pp-002"}


def test_leitner_boxes(tmp_path):
    store = ResultStore("kim", tmp_path)
    assert store.box("pp-001") is None
    boxes = []
    for correct in (True, True, True, True, True, True, False, True):
        store.record([("pp-001", "O", correct)], lang="ko", mode="drill")
        boxes.append(store.box("pp-001"))
    assert boxes == [2, 3, 4, 5, 5, 5, 1, 2]
    assert ResultStore("kim", tmp_path).box("pp-001") == 2


def test_missed_lowest_box_first_and_never_answered_is_not_missed(tmp_path):
    store = ResultStore("kim", tmp_path)
    store.record([("a-1", "O", False)], lang="ko", mode="drill")              # box 1
    store.record([("b-1", "O", False)], lang="ko", mode="drill")
    store.record([("b-1", "O", True)], lang="ko", mode="drill")               # box 2, missed once
    store.record([("c-1", "O", True)], lang="ko", mode="drill")               # never missed
    store.record([("d-1", "X", False)], lang="ko", mode="drill")              # box 1, seen later than a-1
    for _ in range(4):
        store.record([("e-1", "X", True)], lang="ko", mode="drill")
    store.record([("e-1", "O", False)], lang="ko", mode="drill")
    for _ in range(4):
        store.record([("e-1", "X", True)], lang="ko", mode="drill")          # back to box 5: mastered
    assert store.missed() == ["a-1", "d-1", "b-1"]


def test_failed_write_leaves_the_old_file_intact(tmp_path, monkeypatch):
    store = ResultStore("kim", tmp_path)
    store.record([("pp-001", "O", True)], lang="ko", mode="drill")
    before = (tmp_path / "kim.json").read_bytes()

    def killed(*args):
        raise OSError("kernel killed mid-write")

    monkeypatch.setattr(store_module.os, "replace", killed)
    with pytest.raises(OSError, match="mid-write"):
        store.record([("pp-002", "X", True)], lang="ko", mode="drill")
    assert (tmp_path / "kim.json").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["kim.json"]  # no temp file left behind


@pytest.mark.parametrize("content, reason", [
    ("{not json", "not valid JSON"),
    ('{"hello": "world"}', "not an mpkit quiz results file"),
    (json.dumps({"format": FORMAT, "version": 99, "student": "kim", "items": {}}), "version 99"),
    (json.dumps({"format": FORMAT, "version": 1, "student": "kim", "items": {"pp-001": {"answer": "Y"}}}),
     "item 'pp-001' needs answer O/X"),
])
def test_corrupt_or_foreign_file_is_moved_aside_not_overwritten(tmp_path, content, reason):
    (tmp_path / "kim.json").write_text(content, encoding="utf-8")
    with pytest.warns(UserWarning, match=reason) as caught:
        store = ResultStore("kim", tmp_path)
    assert "nothing deleted" in str(caught[0].message)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("kim.corrupt-")]
    assert len(aside) == 1 and aside[0].suffix == ".json"
    assert aside[0].read_text(encoding="utf-8") == content
    store.record([("pp-001", "O", True)], lang="ko", mode="drill")
    assert read_results(tmp_path / "kim.json")["items"]["pp-001"]["answer"] == "O"
    assert aside[0].read_text(encoding="utf-8") == content


def test_a_second_corrupt_file_in_the_same_second_gets_its_own_name(tmp_path):
    for _ in range(2):
        (tmp_path / "kim.json").write_text("{broken", encoding="utf-8")
        with pytest.warns(UserWarning):
            ResultStore("kim", tmp_path)
    assert len(list(tmp_path.glob("kim.corrupt-*.json"))) == 2


def test_read_results_names_the_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("[]", encoding="utf-8")
    with pytest.raises(ResultsFileError, match=f"^{path}: not an mpkit"):
        read_results(path)


def test_student_name_sources_and_sanitising(tmp_path, monkeypatch):
    monkeypatch.setenv("MPKIT_STUDENT", "env-student")
    monkeypatch.setenv("MPKIT_RESULTS_DIR", str(tmp_path / "from-env"))
    assert results_path() == tmp_path / "from-env" / "env-student.json"
    assert results_path("lee", tmp_path) == tmp_path / "lee.json"
    monkeypatch.delenv("MPKIT_STUDENT")
    monkeypatch.delenv("MPKIT_RESULTS_DIR")
    monkeypatch.setattr(store_module.getpass, "getuser", lambda: "login")
    assert results_path() == store_module.Path("quiz_results") / "login.json"
    assert safe_filename("../../etc/passwd") == "etc_passwd"
    assert safe_filename("김 철수/2024") == "김_철수_2024"
    assert safe_filename("\u1100\u1161") == "\uac00"  # NFD Hangul (macOS) -> NFC
    assert safe_filename("...") == "student"
    with pytest.raises(ValueError, match="student must be a non-empty name"):
        ResultStore("  ", tmp_path)
