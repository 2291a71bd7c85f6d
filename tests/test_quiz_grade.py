"""`mpkit quiz grade` against hostile folders, impersonation, spreadsheet formulas and retakes.

Every bad entry sits beside a good file: the bad one is skipped with its name and reason, the
good one is still graded, and nothing hangs (a FIFO would block a plain ``open``).
"""
import json
import os
import socket

import nbformat
import pytest

from mpkit.quiz.handin import HAND_IN_ID, MIME, AnswerSheet, build_sheet
from mpkit.quiz.store import ResultStore, file_stem, read_results
from test_quiz_cli import GOOD, read_csv as rows, run

MP = "mp-001,mp-002,mp-003,mp-004"   # key: O X O X


def summary(out):
    return {row["student"]: row for row in rows(out.with_name(f"{out.stem}.summary.csv"))}


def answer(folder, student, answers, mode="exam", assignment=None):
    ResultStore(student, folder).record([(i, a, False) for i, a in answers.items()], lang="ko", mode=mode,
                                        assignment=assignment)


def notebook(path, sheet=None, grade_id=HAND_IN_ID):
    """A saved assignment notebook whose hand-in cell shows ``sheet`` (None: the cell never ran)."""
    cell = nbformat.v4.new_code_cell("quiz.hand_in(...)", metadata={"nbgrader": {"grade_id": grade_id}})
    if sheet is not None:
        cell.outputs = [nbformat.v4.new_output("display_data", data=AnswerSheet(sheet)._repr_mimebundle_())]
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), path)


def _deep(p):
    p.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")


def _huge(p):
    with open(p, "wb") as f:
        f.truncate(17 * 1024 * 1024)   # sparse: no disk used


def _socket(p):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(p))
    sock.close()


HOSTILE = {  # name -> (make it, the reason printed)
    "deep.json": (_deep, "JSON nested too deeply"),
    "folder.json": (lambda p: p.mkdir(), "a folder, not a regular file"),
    "fifo.json": (lambda p: os.mkfifo(p), "a FIFO (named pipe), not a regular file"),
    "socket.json": (_socket, "a socket, not a regular file"),
    "link.json": (lambda p: p.symlink_to("/etc/passwd"), "a symbolic link (copy the file itself in)"),
    "dangling.json": (lambda p: p.symlink_to(p.with_name("nowhere")), "a symbolic link"),
    "latin1.json": (lambda p: p.write_bytes('{"student": "한"}'.encode("cp949")), "not UTF-8 text"),
    "huge.json": (_huge, "too large (17825792 bytes; the limit is 16777216)"),
    "empty.json": (lambda p: p.write_text("", encoding="utf-8"), "not valid JSON"),
    "digits.json": (lambda p: p.write_text('{"a": ' + "9" * 5000 + "}", encoding="utf-8"), "not valid JSON"),
    "foreign.json": (lambda p: p.write_text('{"students": []}', encoding="utf-8"), "not an mpkit quiz results file"),
    "list.ipynb": (lambda p: p.write_text("[]", encoding="utf-8"), "not a Jupyter notebook"),
    "forged.ipynb": (lambda p: notebook(p, {"format": "mpkit-quiz-answers", "version": 1, "assignment": "hw1",
                                            "items": ["mp-001"], "answers": {"mp-001": ["O", "yes"]}}),
                     "the answer sheet needs an \"items\" list"),
    "plain.ipynb": (lambda p: notebook(p, None, grade_id="something_else"), "no hand-in cell"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_bad_file_is_skipped_with_its_reason_and_the_rest_is_graded(tmp_path, capsys, name):
    folder = tmp_path / "collected"
    folder.mkdir()
    answer(folder, "kim", {"mp-001": "O", "mp-002": "X"})
    make, reason = HOSTILE[name]
    make(folder / name)
    out = tmp_path / "grades.csv"
    assert run("grade", "--bank", GOOD, "--items", MP, folder, "--out", out) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"mpkit quiz grade: skipped {folder / name}: ") and reason in err[0]
    assert list(summary(out)) == ["kim"] and summary(out)["kim"]["correct"] == "2"


def test_identity_comes_from_the_file_name_not_the_student_field(tmp_path, capsys):
    folder = tmp_path / "collected"
    answer(folder, "alice", {"mp-001": "X", "mp-002": "X"})                    # the real alice: 1 right
    answer(folder, "mallory", {"mp-001": "O", "mp-002": "X", "mp-003": "O", "mp-004": "X"})
    data = json.loads((folder / "mallory.json").read_text(encoding="utf-8"))
    data["student"] = "alice"
    (folder / "mallory.json").unlink()
    (folder / "x-mallory.json").write_text(json.dumps(data), encoding="utf-8")  # claims to be alice
    out = tmp_path / "grades.csv"
    assert run("grade", "--bank", GOOD, "--items", MP, folder, "--out", out) == 0
    graded = summary(out)
    assert {s: r["correct"] for s, r in graded.items()} == {"alice": "1", "x-mallory": "4"}
    assert graded["x-mallory"]["note"] == "the file says student 'alice'; graded as 'x-mallory' from the file name"
    assert capsys.readouterr().err == (f"mpkit quiz grade: note: {folder / 'x-mallory.json'}: the file says "
                                       "student 'alice'; graded as 'x-mallory' from the file name\n")


def test_one_student_twice_is_graded_once(tmp_path, capsys):
    folder = tmp_path / "collected"
    answer(folder, "kim", {"mp-001": "O"})
    notebook(folder / "kim.ipynb", build_sheet("hw1", ["mp-001"], read_results(folder / "kim.json")))
    assert run("grade", "--bank", GOOD, "--items", MP, folder, "--out", tmp_path / "g.csv") == 1
    assert f"skipped {folder / 'kim.json'}: student 'kim' was already graded from {folder / 'kim.ipynb'}" \
        in capsys.readouterr().err


@pytest.mark.parametrize("name", ["=HYPERLINK(\"http://x\",\"y\")", "+1+2", "-3", "@SUM(A1)", "\tx", "\rx"])
def test_csv_cells_never_become_spreadsheet_formulas(tmp_path, name):
    folder = tmp_path / "collected"
    answer(folder, name.strip(), {"mp-001": "O"})
    (folder / f"{file_stem(name.strip())}.json").rename(folder / f"{file_stem(name)}.json")  # the collected name
    out = tmp_path / "grades.csv"
    assert run("grade", "--bank", GOOD, folder, "--out", out) == 0
    assert [r["student"] for r in rows(out)] == [f"'{name}"]
    assert list(summary(out)) == [f"'{name}"]


def test_outputs_never_write_through_a_link_or_into_a_fifo(tmp_path, capsys):
    folder = tmp_path / "collected"
    answer(folder, "kim", {"mp-001": "O"})
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me", encoding="utf-8")
    (folder / "grades.summary.csv").symlink_to(precious)     # planted among the collected files
    assert run("grade", "--bank", GOOD, "--items", MP, folder, "--out", folder / "grades.csv") == 2
    assert "grades.summary.csv is a symbolic link; give the name of a new or regular file" in capsys.readouterr().err
    assert precious.read_text(encoding="utf-8") == "keep me"
    os.mkfifo(tmp_path / "fifo.csv")
    assert run("grade", "--bank", GOOD, "--items", MP, folder, "--out", tmp_path / "fifo.csv") == 2
    assert "fifo.csv is not a regular file" in capsys.readouterr().err
    (tmp_path / "s.key.md").symlink_to(precious)
    assert run("sheet", "--bank", GOOD, "--items", MP, "--out", tmp_path / "s.md") == 2
    assert "s.key.md is a symbolic link" in capsys.readouterr().err and precious.read_text(encoding="utf-8") == "keep me"
    (tmp_path / "hw.ipynb").symlink_to(precious)
    assert run("assign", "--bank", GOOD, "--items", MP, "--out", tmp_path / "hw.ipynb") == 2
    assert precious.read_text(encoding="utf-8") == "keep me"


def test_the_first_answer_counts_and_retakes_are_reported(tmp_path):
    folder = tmp_path / "collected"
    answer(folder, "park", {"mp-001": "X", "mp-002": "X", "mp-003": None})     # submitted: key shown
    answer(folder, "park", {"mp-001": "O", "mp-002": "X", "mp-003": "O"})      # retake after the key
    answer(folder, "park", {"mp-004": "X"}, assignment="hw2")
    out = tmp_path / "grades.csv"
    assert run("grade", "--bank", GOOD, "--items", MP, folder, "--out", out) == 0
    assert [(r["item_id"], r["answer_given"], r["correct"], r["attempts"], r["last_answer"]) for r in rows(out)] == [
        ("mp-001", "X", "0", "2", "O"), ("mp-002", "X", "1", "2", "X"), ("mp-003", "", "0", "2", "O"),
        ("mp-004", "X", "1", "1", "")]
    assert (summary(out)["park"]["correct"], summary(out)["park"]["retaken"]) == ("2", "3")
    assert run("grade", "--bank", GOOD, "--items", MP, "--assignment", "hw2", folder, "--out", out) == 0
    assert [(r["item_id"], r["answer_given"]) for r in rows(out)] == [
        ("mp-001", ""), ("mp-002", ""), ("mp-003", ""), ("mp-004", "X")]


def test_notebooks(tmp_path, capsys):
    folder = tmp_path / "collected"
    folder.mkdir()
    laptop = tmp_path / "laptop"
    answer(laptop, "kim", {"mp-001": "O", "mp-002": "O"}, assignment="hw1")
    answer(laptop, "kim", {"mp-001": "X"}, assignment="hw1")                    # a retake: not counted
    notebook(folder / "kim.ipynb", build_sheet("hw1", MP.split(","), read_results(laptop / "kim.json")))
    notebook(folder / "lee.ipynb", None)                                        # hand-in never run
    notebook(folder / "park.ipynb", build_sheet("hw9", ["mp-001"], read_results(laptop / "kim.json")))
    out = tmp_path / "grades.csv"
    assert run("grade", "--bank", GOOD, folder, "--out", out) == 1               # no item list: refused
    assert "grading notebooks needs --items or --topic" in capsys.readouterr().err
    assert run("grade", "--bank", GOOD, "--items", MP, "--assignment", "hw1", folder, "--out", out) == 1
    err = capsys.readouterr().err
    assert f"skipped {folder / 'park.ipynb'}: the answer sheet is for assignment 'hw9', not 'hw1'" in err
    graded = summary(out)
    assert {s: (r["correct"], r["retaken"]) for s, r in graded.items()} == {"kim": ("1", "1"), "lee": ("0", "0")}
    assert graded["lee"]["note"] == "no answer sheet in the notebook: the hand-in cell was not run before saving"


def test_the_answer_sheet_carries_answers_and_no_key(tmp_path):
    answer(tmp_path, "kim", {"mp-001": "O", "mp-002": None}, assignment="hw1")
    answer(tmp_path, "kim", {"mp-001": "X"})                                    # not part of hw1
    sheet = build_sheet("hw1", ["mp-001", "mp-002", "mp-003"], read_results(tmp_path / "kim.json"))
    assert sheet == {"format": "mpkit-quiz-answers", "version": 1, "assignment": "hw1",
                     "items": ["mp-001", "mp-002", "mp-003"], "answers": {"mp-001": ["O"], "mp-002": [None]}}
    bundle = AnswerSheet(sheet, "en")._repr_mimebundle_()
    assert bundle[MIME] == sheet and bundle["text/plain"] == "3문항 중 1문항에 답함 / answered 1 of 3 items"
    assert "<td>mp-002</td><td><b>–</b></td>" in bundle["text/html"] and "key" not in bundle["text/html"]
