"""Results store: where it lives, locking (8 writers lose nothing), atomic writes, killed writers,
corrupt files moved aside, names that never collide, history and Leitner boxes."""
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest

from mpkit.quiz import store as store_module
from mpkit.quiz.store import (FORMAT, ResultStore, ResultsFileError, default_results_dir, file_stem,
                              read_results, results_path, student_of)


def test_record_appends_history_and_survives_a_new_store(tmp_path):
    first = ResultStore("kim", tmp_path)
    first.record([("pp-001", "O", True)], lang="ko", mode="drill")
    again = ResultStore("kim", tmp_path)  # a re-run cell / restarted kernel
    again.record([("pp-001", "X", False), ("pp-002", "O", True), ("pp-003", None, False)],
                 lang="en", mode="exam", assignment="hw1")
    data = json.loads((tmp_path / "kim.json").read_text(encoding="utf-8"))
    assert (data["format"], data["version"], data["student"]) == (FORMAT, 2, "kim")
    entry = data["items"]["pp-001"]
    assert [(h["answer"], h["correct"], h["lang"], h["mode"], h.get("assignment")) for h in entry["history"]] == \
        [("O", True, "ko", "drill", None), ("X", False, "en", "exam", "hw1")]
    assert (entry["answer"], entry["correct"], entry["at"]) == ("X", False, entry["history"][-1]["at"])
    assert entry["history"][0]["session"] != entry["history"][1]["session"]
    assert data["items"]["pp-002"]["answer"] == "O"
    assert data["items"]["pp-003"]["answer"] is None and data["items"]["pp-003"]["box"] == 1  # blank: key shown
    assert store_module.answers(data) == {"pp-001": ["O", "X"], "pp-002": ["O"], "pp-003": [None]}
    assert store_module.answers(data, "hw1") == {"pp-001": ["X"], "pp-002": ["O"], "pp-003": [None]}


def test_version_1_files_are_read(tmp_path):
    v1 = {"format": FORMAT, "version": 1, "student": "kim", "items": {"pp-001": {
        "answer": "O", "correct": True, "at": "t", "box": 2, "history": [{"answer": "O", "correct": True}]}}}
    (tmp_path / "kim.json").write_text(json.dumps(v1), encoding="utf-8")
    store = ResultStore("kim", tmp_path)
    store.record([("pp-002", "X", True)], lang="ko", mode="drill")
    assert store_module.answers(read_results(tmp_path / "kim.json")) == {"pp-001": ["O"], "pp-002": ["X"]}


def test_two_open_stores_for_one_student_keep_each_others_answers(tmp_path):
    a, b = ResultStore("kim", tmp_path), ResultStore("kim", tmp_path)
    a.record([("pp-001", "O", True)], lang="ko", mode="drill")
    b.record([("pp-002", "X", True)], lang="ko", mode="drill")
    assert set(read_results(tmp_path / "kim.json")["items"]) == {"pp-001", "pp-002"}


def _writer(results_dir, worker, answers, start):
    start.wait()
    store = ResultStore("kim", results_dir)
    for n in range(answers):
        store.record([(f"w{worker}-{n % 5}", "O" if n % 2 else "X", bool(n % 3))], lang="ko", mode="drill")


@pytest.mark.timeout(120)
def test_eight_concurrent_writers_for_one_student_lose_nothing(tmp_path):
    """Two tabs, a re-run kernel, ...: 8 processes x 20 answers, released at once -> 160 saved."""
    ctx = multiprocessing.get_context("fork")    # separate processes: nothing shared but the file
    start = ctx.Event()
    workers = [ctx.Process(target=_writer, args=(tmp_path, w, 20, start)) for w in range(8)]
    for p in workers:
        p.start()
    start.set()
    for p in workers:
        p.join(timeout=100)
        assert p.exitcode == 0
    data = read_results(tmp_path / "kim.json")
    saved = sum(len(entry["history"]) for entry in data["items"].values())
    assert saved == 160 and len(data["items"]) == 8 * 5
    assert sorted(os.listdir(tmp_path)) == [".kim.json.lock", "kim.json"]   # no temp file left


KILLED_WRITER = """
import os, sys, time
from mpkit.quiz.store import ResultStore
store = ResultStore("kim", sys.argv[1])
os.replace = lambda *args: time.sleep(600)   # killed between writing the temp file and renaming it
store.record([("pp-009", "O", True)], lang="ko", mode="drill")
"""


@pytest.mark.timeout(120)
def test_a_temp_file_left_by_a_killed_writer_is_removed_by_the_next_one(tmp_path):
    ResultStore("kim", tmp_path).record([("pp-001", "O", True)], lang="ko", mode="drill")
    before = (tmp_path / "kim.json").read_bytes()
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)])
    try:
        deadline = time.monotonic() + 90
        while not [p for p in os.listdir(tmp_path) if ".tmp-" in p]:
            assert child.poll() is None and time.monotonic() < deadline, "the writer never wrote its temp file"
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert (tmp_path / "kim.json").read_bytes() == before   # the old file is intact
    ResultStore("kim", tmp_path).record([("pp-002", "X", True)], lang="ko", mode="drill")
    assert sorted(os.listdir(tmp_path)) == [".kim.json.lock", "kim.json"]
    assert set(read_results(tmp_path / "kim.json")["items"]) == {"pp-001", "pp-002"}


def test_another_students_temp_file_is_left_alone(tmp_path):
    other = tmp_path / ".kim.json.x.json.tmp-abcdefgh"    # the temp of student "kim.json.x"
    other.write_text("{}", encoding="utf-8")
    ResultStore("kim", tmp_path).record([("pp-001", "O", True)], lang="ko", mode="drill")
    assert other.exists()


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
    assert sorted(os.listdir(tmp_path)) == [".kim.json.lock", "kim.json"]  # no temp file left behind


@pytest.mark.parametrize("content, reason", [
    ("{not json", "not valid JSON"),
    ("[" * 100_000, "nested too deeply"),
    ('{"hello": "world"}', "not an mpkit quiz results file"),
    (json.dumps({"format": FORMAT, "version": 99, "student": "kim", "items": {}}), "version 99"),
    (json.dumps({"format": FORMAT, "version": 1, "student": "kim", "items": {"pp-001": {"answer": "Y"}}}),
     "item 'pp-001' needs answer O/X"),
    (json.dumps({"format": FORMAT, "version": 2, "student": "kim", "items": {"pp-001": {
        "answer": "O", "box": 1, "at": "x", "history": [{"answer": "O", "at": 5}]}}}), "item 'pp-001' needs answer O/X"),
], ids=["broken", "deep", "foreign", "version", "bad-answer", "time-not-text"])
def test_corrupt_or_foreign_file_is_moved_aside_not_overwritten(tmp_path, content, reason):
    (tmp_path / "kim.json").write_text(content, encoding="utf-8")
    with pytest.warns(UserWarning, match=reason) as caught:
        store = ResultStore("kim", tmp_path)
    assert "nothing deleted" in str(caught[0].message)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("kim.json.corrupt-")]
    assert len(aside) == 1 and aside[0].read_text(encoding="utf-8") == content
    store.record([("pp-001", "O", True)], lang="ko", mode="drill")
    assert read_results(tmp_path / "kim.json")["items"]["pp-001"]["answer"] == "O"
    assert aside[0].read_text(encoding="utf-8") == content


def test_a_second_corrupt_file_in_the_same_second_gets_its_own_name(tmp_path):
    for _ in range(2):
        (tmp_path / "kim.json").write_text("{broken", encoding="utf-8")
        with pytest.warns(UserWarning):
            ResultStore("kim", tmp_path)
    assert len(list(tmp_path.glob("kim.json.corrupt-*"))) == 2


def test_read_results_names_the_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("[]", encoding="utf-8")
    with pytest.raises(ResultsFileError, match=f"^{path}: not an mpkit"):
        read_results(path)


def test_names_that_differ_get_different_files_and_map_back(tmp_path):
    names = ["lee@1", "lee#1", "lee_1", "lee 1", "lee%401", "김 철수/2024", "../../etc/passwd", "...", ".hidden",
             "kim.json", "=cmd|' /C calc'!A0", "a\tb"]
    stems = [file_stem(name) for name in names]
    assert len(set(stems)) == len(names)
    assert [student_of(stem) for stem in stems] == names
    assert all("/" not in stem and not stem.startswith(".") for stem in stems)
    assert file_stem("김철수-2024.kr") == "김철수-2024.kr"              # Hangul and ids stay readable
    for name in names:
        ResultStore(name, tmp_path).record([("pp-001", "O", True)], lang="ko", mode="drill")
    assert sorted(read_results(p)["student"] for p in tmp_path.glob("*.json")) == sorted(names)
    assert results_path("\u1100\u1161", tmp_path) == tmp_path / "\uac00.json"   # NFD Hangul (macOS) -> NFC


def test_a_file_holding_another_name_is_refused(tmp_path):
    """On a case-insensitive disk 'Kim' would open kim.json: refused, never merged."""
    ResultStore("kim", tmp_path).record([("pp-001", "O", True)], lang="ko", mode="drill")
    os.rename(tmp_path / "kim.json", tmp_path / "Kim.json")
    with pytest.raises(ValueError, match=r"Kim.json holds the answers of 'kim', not 'Kim'"):
        ResultStore("Kim", tmp_path)


@pytest.mark.parametrize("bad", ["  ", "", None, 7, "x" * 65])
def test_bad_student_names_are_refused(tmp_path, bad, monkeypatch):
    monkeypatch.delenv("MPKIT_STUDENT", raising=False)
    if bad is None:
        monkeypatch.setattr(store_module.getpass, "getuser", lambda: "login")
        assert ResultStore(bad, tmp_path).student == "login"
        return
    with pytest.raises(ValueError, match="student"):
        ResultStore(bad, tmp_path)


def test_where_results_go(tmp_path, monkeypatch):
    monkeypatch.setenv("MPKIT_STUDENT", "env-student")
    monkeypatch.setenv("MPKIT_RESULTS_DIR", str(tmp_path / "from-env"))
    assert results_path() == tmp_path / "from-env" / "env-student.json"
    assert results_path("lee", tmp_path) == tmp_path / "lee.json"
    monkeypatch.delenv("MPKIT_RESULTS_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert results_path() == tmp_path / "xdg" / "mpkit" / "quiz_results" / "env-student.json"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")     # the XDG spec: absolute paths only
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_results_dir() == tmp_path / "home" / ".local" / "share" / "mpkit" / "quiz_results"


def test_the_first_save_into_the_default_folder_says_where_once(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MPKIT_RESULTS_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setattr(store_module, "_announced", False)
    ResultStore("kim", tmp_path / "chosen").record([("pp-001", "O", True)], lang="ko", mode="drill")
    assert capsys.readouterr().out == ""                         # a folder the caller chose: no notice
    store = ResultStore("kim")
    store.record([("pp-001", "O", True)], lang="ko", mode="drill")
    path = tmp_path / "mpkit" / "quiz_results" / "kim.json"
    assert capsys.readouterr().out.splitlines() == [
        f"퀴즈 답안 저장 위치: {path} (다른 폴더를 쓰려면 MPKIT_RESULTS_DIR를 설정하세요)",
        f"Quiz answers are saved in {path} (set MPKIT_RESULTS_DIR to use another folder)"]
    ResultStore("lee").record([("pp-001", "O", True)], lang="ko", mode="drill")
    store.record([("pp-002", "O", True)], lang="ko", mode="drill")
    assert capsys.readouterr().out == ""                         # once per kernel


def _first_version_file(folder, student, answers):
    """A results file as mpkit's first version wrote it: ``<folder>/quiz_results/<stem>.json``,
    version 1, one history entry per answer (``answers``: (item, answer, correct, at))."""
    items = {}
    for item_id, answer, correct, at in answers:
        entry = items.setdefault(item_id, {"answer": answer, "correct": False, "at": at, "box": 1, "history": []})
        entry["history"].append({"answer": answer, "correct": correct, "at": at, "lang": "ko", "mode": "drill",
                                 "session": "old"})
        entry.update(answer=answer, correct=correct, at=at, box=min(5, entry["box"] + 1) if correct else 1)
    path = store_module.legacy_path(student, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": FORMAT, "version": 1, "student": student, "created": "x",
                                "updated": "x", "items": items}), encoding="utf-8")
    return path


@pytest.fixture
def default_folder(tmp_path, monkeypatch):
    """The default results folder under tmp_path, the kernel's folder (cwd) tmp_path/labs."""
    monkeypatch.delenv("MPKIT_RESULTS_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(store_module, "_announced", True)
    monkeypatch.setenv("MPKIT_STUDENT", "kim")
    (tmp_path / "labs").mkdir()
    monkeypatch.chdir(tmp_path / "labs")
    return tmp_path / "xdg" / "mpkit" / "quiz_results"


def test_answers_of_the_first_version_are_copied_in_once_in_time_order(default_folder, capsys):
    old = _first_version_file(".", "kim", [("pp-001", "X", False, "2026-11-01T09:00:00.000+00:00"),
                                           ("pp-001", "O", True, "2026-11-01T09:01:00.000+00:00"),
                                           ("dp-002", "O", True, "2026-11-01T09:02:00.000+00:00")])
    before = old.read_bytes()
    # answered in the new folder before the upgrade's first quiz found the old file: both kept
    new = default_folder / "kim.json"
    ResultStore("kim", default_folder).record([("pp-001", "O", True)], lang="en", mode="drill")
    store = ResultStore()
    assert [h["answer"] for h in store.data["items"]["pp-001"]["history"]] == ["X", "O", "O"]
    assert store.data["items"]["pp-001"]["history"][-1]["lang"] == "en"  # the new one stays last
    assert store.box("pp-001") == 3 and store.box("dp-002") == 2  # replayed: wrong, right, right
    assert store_module.answers(read_results(new)) == {"pp-001": ["X", "O", "O"], "dp-002": ["O"]}
    assert old.read_bytes() == before                               # only read
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"Copied 3 answers an earlier mpkit saved in {old.resolve()} to {new} (the old file is left as it is)")
    # opened again: nothing counted twice, nothing said
    ResultStore().record([("dp-002", "X", False)], lang="ko", mode="drill")
    assert store_module.answers(read_results(new)) == {"pp-001": ["X", "O", "O"], "dp-002": ["O", "X"]}
    assert capsys.readouterr().out == ""
    # a kernel still running the first version wrote one more: the next open copies just that
    _first_version_file(".", "kim", [("pp-001", "X", False, "2026-11-01T09:00:00.000+00:00"),
                                     ("pp-001", "O", True, "2026-11-01T09:01:00.000+00:00"),
                                     ("dp-002", "O", True, "2026-11-01T09:02:00.000+00:00"),
                                     ("tp-003", "X", True, "2026-12-05T09:00:00.000+00:00")])
    assert ResultStore().box("tp-003") == 2 and "Copied 1 answers" in capsys.readouterr().out


def test_old_files_that_are_not_this_students_are_left_alone(default_folder, monkeypatch):
    other = _first_version_file(".", "lee#1", [("pp-001", "O", True, "2026-11-01T09:00:00.000+00:00")])
    assert other == store_module.legacy_path("lee@1", ".")  # the first version's stems were lossy
    monkeypatch.setenv("MPKIT_STUDENT", "lee@1")
    ResultStore().record([("pp-002", "X", False)], lang="ko", mode="drill")
    assert set(read_results(default_folder / "lee%401.json")["items"]) == {"pp-002"}
    # a name given (an instructor reviewing kim beside collected files): never copied
    _first_version_file(".", "kim", [("pp-001", "O", True, "2026-11-01T09:00:00.000+00:00")])
    assert ResultStore("kim").data["items"] == {}
    monkeypatch.setattr(store_module.os, "getuid", lambda: os.stat(".").st_uid + 1)  # another user's file
    monkeypatch.setenv("MPKIT_STUDENT", "kim")
    assert ResultStore().data["items"] == {}


def test_an_unreadable_old_file_or_folder_warns_and_the_quiz_works_on(default_folder, monkeypatch):
    monkeypatch.setenv("MPKIT_STUDENT", "park")
    broken = store_module.legacy_path("park", ".")
    broken.parent.mkdir()
    broken.write_text("{not json", encoding="utf-8")
    with pytest.warns(UserWarning, match="not copied"):
        store = ResultStore()
    store.record([("pp-001", "O", True)], lang="ko", mode="drill")
    assert broken.read_text(encoding="utf-8") == "{not json"
    monkeypatch.setattr(store_module.Path, "cwd", classmethod(lambda cls: (_ for _ in ()).throw(
        FileNotFoundError("the kernel's folder was deleted"))))
    with pytest.warns(UserWarning, match="folder was deleted"):
        assert set(ResultStore().data["items"]) == {"pp-001"}


def test_an_old_file_with_times_that_are_not_text_warns_and_the_quiz_works_on(default_folder):
    ResultStore().record([("pp-001", "O", True)], lang="ko", mode="drill")
    old = _first_version_file(".", "kim", [("pp-001", "X", False, "2026-11-01T09:00:00.000+00:00")])
    data = json.loads(old.read_text(encoding="utf-8"))
    data["items"]["pp-001"]["history"][0]["at"] = 5   # sorting by time would compare 5 with text
    old.write_text(json.dumps(data), encoding="utf-8")
    with pytest.warns(UserWarning, match="not copied"):
        store = ResultStore()
    assert store_module.answers(store.data) == {"pp-001": ["O"]}


def test_a_legacy_folder_linked_to_the_data_folder_is_this_file(default_folder, monkeypatch):
    monkeypatch.setenv("MPKIT_STUDENT", "kim")
    ResultStore().record([("pp-001", "O", True)], lang="ko", mode="drill")
    os.symlink(default_folder, "quiz_results")               # labs/quiz_results -> the data folder
    store = ResultStore()
    assert store_module.answers(store.data) == {"pp-001": ["O"]} and (default_folder / "kim.json").is_file()


def test_a_chosen_folder_never_takes_old_answers(default_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("MPKIT_STUDENT", "kim")
    old = _first_version_file(".", "kim", [("pp-001", "O", True, "2026-11-01T09:00:00.000+00:00")])
    assert ResultStore(None, tmp_path / "chosen").data["items"] == {}
    monkeypatch.setenv("MPKIT_RESULTS_DIR", str(tmp_path / "env"))
    assert ResultStore().data["items"] == {}
    assert old.exists()
