"""`mpkit quiz lint|assign|grade|stats|sheet`, through the quiz parser alone (register())."""
import argparse
import csv
import json
import re
import shutil
from pathlib import Path

import jsonschema
import nbformat
import pytest

from mpkit.cli.quiz import register
from mpkit.quiz.store import ResultStore

GOOD = Path(__file__).parent / "fixtures" / "quiz" / "good"
# nbgrader's cell metadata schema, version 3 (nbgrader/nbgraderformat/v3.json), less the
# fields only `nbgrader generate_assignment` adds (checksum, cell_type).
NBGRADER_V3 = {
    "type": "object",
    "properties": {
        "schema_version": {"type": "integer", "minimum": 3, "maximum": 3},
        "grade": {"type": "boolean"}, "locked": {"type": "boolean"},
        "solution": {"type": "boolean"}, "task": {"type": "boolean"},
        "grade_id": {"type": "string", "pattern": "^[a-zA-Z0-9_\\-]*$"},
        "points": {"type": "number", "minimum": 0},
    },
    "required": ["schema_version", "grade", "locked", "solution"],
    "additionalProperties": False,
}


def run(*argv):
    parser = argparse.ArgumentParser(prog="mpkit")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["quiz", *map(str, argv)])
    return args.handler(args)


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_lint_good_and_bad(tmp_path, capsys):
    assert run("lint", "--bank", GOOD) == 0
    out = capsys.readouterr().out
    assert "0 errors" in out and "model_parallel       4    2    2      50%" in out
    bank = Path(shutil.copytree(GOOD, tmp_path / "bank"))
    path = bank / "pipeline.yaml"
    path.write_text(path.read_text(encoding="utf-8").replace("answer: X", "answer: no"), encoding="utf-8")
    assert run("lint", "--bank", bank) == 1
    out = capsys.readouterr().out
    assert f"{path}:14 pp-002: answer must be the capital letter O (true) or X (false); got False" in out
    assert "1 errors" in out


def _check_nbgrader_metadata(nb):
    nbformat.validate(nb)
    grade_ids = []
    for cell in nb.cells:
        meta = cell.metadata["nbgrader"]
        jsonschema.validate(meta, NBGRADER_V3)
        assert meta["locked"] and not meta["solution"] and ("points" in meta) == meta["grade"]
        grade_ids.append(meta["grade_id"])
    assert len(set(grade_ids)) == len(grade_ids)
    graded = [c for c in nb.cells if c.metadata["nbgrader"]["grade"]]
    assert len(graded) == 1 and graded[0].metadata["nbgrader"]["grade_id"] == "quiz_hand_in"
    return graded[0]


def test_assign_students_copy_has_no_key_and_nothing_to_type(tmp_path, capsys):
    out = tmp_path / "hw" / "week1.ipynb"
    assert run("assign", "--bank", GOOD, "--topic", "all", "--n", "4", "--seed", "7", "--out", out) == 0
    printed = capsys.readouterr().out
    assert "assignment 'week1', 4 items, mode=exam, lang=ko, students' copy (no key)" in printed
    nb = nbformat.read(out, as_version=4)
    hand_in = _check_nbgrader_metadata(nb)
    assert hand_in.metadata["nbgrader"]["points"] == 4
    assert "BEGIN HIDDEN TESTS" not in hand_in.source and "ANSWER_KEY" not in hand_in.source
    ids = re.findall(r"'([a-z]+-\d+)'", hand_in.source)
    assert f"--items {','.join(ids)} --assignment week1" in printed
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert code[0] == "from mpkit import quiz" and "STUDENT" not in json.dumps(nb)
    assert all("mode='exam'" in c and "lang='ko'" in c and "assignment='week1'" in c for c in code[1:-1])
    assert "한국어" in nb.cells[0].source and "English" in nb.cells[0].source
    assert not (tmp_path / "nbgrader_config.py").exists() and not (tmp_path / "hw" / "nbgrader_config.py").exists()
    again = tmp_path / "week1.ipynb"
    run("assign", "--bank", GOOD, "--topic", "all", "--n", "4", "--seed", "7", "--out", again)
    assert [c.source for c in nbformat.read(again, as_version=4).cells] == [c.source for c in nb.cells]


def test_assign_into_an_nbgrader_course_hides_the_key_and_registers_the_grader(tmp_path, capsys):
    course = tmp_path / "course"
    course.mkdir()
    (course / "nbgrader_config.py").write_text('c = get_config()\nc.CourseDirectory.course_id = "mp101"\n',
                                               encoding="utf-8")
    out = course / "source" / "hw1" / "quiz.ipynb"
    for _ in range(2):
        assert run("assign", "--bank", GOOD, "--items", "mp-001,mp-002,pp-001", "--mode", "drill",
                   "--lang", "en", "--out", out) == 0
    printed = capsys.readouterr().out
    assert "assignment 'hw1', 3 items, mode=drill, lang=en, instructor's copy (the key is in hidden tests)" in printed
    assert "next: nbgrader generate_assignment hw1" in printed
    config = (course / "nbgrader_config.py").read_text(encoding="utf-8")
    assert config.startswith('c = get_config()\nc.CourseDirectory.course_id = "mp101"\n')
    assert config.count("from mpkit.quiz.nbgrader import configure\nconfigure(c)\n") == 1   # once, however often
    hand_in = _check_nbgrader_metadata(nbformat.read(out, as_version=4))
    assert hand_in.source.endswith("### BEGIN HIDDEN TESTS\n"
                                   "# 정답: 학생용 노트북에서는 지워지고 채점할 때 복원됩니다.\n"
                                   "# The key: removed from the students' copy, restored by nbgrader autograde.\n"
                                   "ANSWER_KEY = {'mp-001': 'O', 'mp-002': 'X', 'pp-001': 'O'}\n"
                                   "### END HIDDEN TESTS")
    from mpkit.quiz.nbgrader import read_key
    assert read_key(hand_in.source) == {"mp-001": "O", "mp-002": "X", "pp-001": "O"}
    assert run("assign", "--bank", GOOD, "--items", "mp-001", "--with-key", "--name", "quiz-2",
               "--out", tmp_path / "elsewhere.ipynb") == 0
    assert "ANSWER_KEY" in nbformat.read(tmp_path / "elsewhere.ipynb", as_version=4).cells[-1].source


def test_a_students_copy_runs_and_its_saved_notebook_is_graded_without_nbgrader(tmp_path, monkeypatch, capsys):
    """Run the students' copy as a kernel would (answers through Quiz.answer/submit), save the
    hand-in output into the notebook as Jupyter does, collect it as <student id>.ipynb, grade."""
    out = tmp_path / "hw1.ipynb"
    run("assign", "--bank", GOOD, "--items", "mp-001,mp-002,mp-003,pp-001", "--out", out)
    capsys.readouterr()
    monkeypatch.setenv("MPKIT_QUIZ_DIR", str(GOOD))
    monkeypatch.setenv("MPKIT_RESULTS_DIR", str(tmp_path / "laptop"))
    shown = []
    monkeypatch.setattr("IPython.display.display", shown.append)
    nb = nbformat.read(out, as_version=4)
    namespace = {}
    exec(nb.cells[1].source, namespace)                           # from mpkit import quiz
    answers = {"mp-001": "O", "mp-002": "O", "pp-001": "O"}       # mp-002 wrong, mp-003 blank
    for cell in nb.cells[2:-1]:
        if cell.cell_type == "code":
            q = eval(cell.source, namespace)
            for item in q.items:
                if item.id in answers:
                    q.answer(item.id, answers[item.id])
            q.submit()
    assert exec(nb.cells[-1].source, namespace) is None and len(shown) == 1   # hand_in displays, returns None
    nb.cells[-1].outputs = [nbformat.v4.new_output("display_data", data=shown[0]._repr_mimebundle_())]
    collected = tmp_path / "collected"
    collected.mkdir()
    nbformat.write(nb, collected / "kim-2024001.ipynb")
    grades = tmp_path / "grades.csv"
    assert run("grade", "--bank", GOOD, "--items", "mp-001,mp-002,mp-003,pp-001", "--assignment", "hw1",
               collected, "--out", grades) == 0
    rows = read_csv(grades)
    assert [(r["student"], r["item_id"], r["answer_given"], r["correct"]) for r in rows] == [
        ("kim-2024001", "mp-001", "O", "1"), ("kim-2024001", "mp-002", "O", "0"),
        ("kim-2024001", "mp-003", "", "0"), ("kim-2024001", "pp-001", "O", "1")]


def _submissions(tmp_path):
    """Three good students, one who edited their file to claim full marks, and three bad files."""
    folder = tmp_path / "submitted"
    for student, answers in {"kim": "OXOX", "lee": "OOOO"}.items():
        ResultStore(student, folder).record(
            [(f"mp-00{i}", a, True) for i, a in enumerate(answers, start=1)], lang="ko", mode="exam")
    ResultStore("park", folder).record([("mp-001", "X", False)], lang="en", mode="exam")
    cheat = folder / "choi.json"
    ResultStore("choi", folder).record([("mp-001", "X", False), ("mp-002", "O", False)], lang="ko", mode="exam")
    data = json.loads(cheat.read_text(encoding="utf-8"))
    data["score"] = 100
    for entry in data["items"].values():
        entry["correct"] = True
        for event in entry["history"]:
            event["correct"] = True
    cheat.write_text(json.dumps(data), encoding="utf-8")
    (folder / "broken.json").write_text('{"format": "mpkit-quiz-res', encoding="utf-8")
    (folder / "foreign.json").write_text('{"students": []}', encoding="utf-8")
    ResultStore("other-course", folder).record([("zz-001", "O", True)], lang="ko", mode="exam")
    (folder / "kim.json.corrupt-20250101T000000").write_text("{", encoding="utf-8")  # moved aside: skipped
    return folder


def test_grade_recomputes_scores_and_continues_past_bad_files(tmp_path, capsys):
    folder = _submissions(tmp_path)
    out = tmp_path / "grades.csv"
    assert run("grade", "--bank", GOOD, "--topic", "model_parallel", folder, "--out", out) == 1
    captured = capsys.readouterr()
    assert "graded 4 students" in captured.out
    bad = captured.err.splitlines()
    assert len(bad) == 3
    assert any(f"{folder / 'broken.json'}: not valid JSON" in line for line in bad)
    assert any(f"{folder / 'foreign.json'}: not an mpkit quiz results file" in line for line in bad)
    assert any(f"{folder / 'other-course.json'}: item ids not in the bank" in line and "zz-001" in line
               for line in bad)
    rows = read_csv(out)
    assert list(rows[0]) == ["student", "item_id", "topic", "pitfall", "answer_given", "correct_answer", "correct",
                             "attempts", "last_answer"]
    assert len(rows) == 4 * 4
    choi = {r["item_id"]: r for r in rows if r["student"] == "choi"}
    assert [(choi[i]["answer_given"], choi[i]["correct"]) for i in ("mp-001", "mp-002", "mp-003")] == \
        [("X", "0"), ("O", "0"), ("", "0")]
    assert choi["mp-002"]["correct_answer"] == "X" and choi["mp-002"]["pitfall"] == "confuses-dp-with-mp"
    summary = {r["student"]: r for r in read_csv(tmp_path / "grades.summary.csv")}
    assert {s: (r["answered"], r["correct"], r["total"], r["percent"]) for s, r in summary.items()} == {
        "kim": ("4", "4", "4", "100.0"), "lee": ("4", "2", "4", "50.0"),
        "park": ("1", "0", "4", "0.0"), "choi": ("2", "0", "4", "0.0")}
    assert summary["choi"]["file"] == str(folder / "choi.json")


def test_grade_without_selection_uses_answered_items_and_single_files(tmp_path, capsys):
    folder = _submissions(tmp_path)
    out = tmp_path / "g.csv"
    assert run("grade", "--bank", GOOD, folder / "park.json", folder / "lee.json", "--out", out) == 0
    assert [(r["student"], r["item_id"]) for r in read_csv(out)] == \
        [("park", "mp-001")] + [("lee", f"mp-00{i}") for i in range(1, 5)]
    assert run("grade", "--bank", GOOD, tmp_path / "missing.json", "--out", out) == 1
    assert "missing.json: no such file or folder" in capsys.readouterr().err
    assert read_csv(out) == []


def test_stats_hardest_items_and_pitfall_error_rates(tmp_path, capsys):
    folder = _submissions(tmp_path)
    out = tmp_path / "grades.csv"
    run("grade", "--bank", GOOD, "--topic", "model_parallel", folder, "--out", out)
    capsys.readouterr()
    assert run("stats", out) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0] == "4 students, 16 graded answers"
    items = [line.split() for line in lines[lines.index("Items, hardest first (share correct among answers):") + 2:]
             if line.strip()][:4]
    # correct shares: mp-002 1/3, mp-001 2/4, mp-003 2/2, mp-004 1/2 -> hardest first
    assert [(row[0], row[3], row[4], row[5]) for row in items] == [
        ("mp-002", "3", "33%", "1"), ("mp-001", "4", "50%", "0"), ("mp-004", "2", "50%", "2"),
        ("mp-003", "2", "100%", "2")]
    pitfalls = lines[lines.index("Pitfalls, most errors first:") + 2:]
    assert [row.split() for row in pitfalls] == [["confuses-dp-with-mp", "7", "4", "57%"],
                                                 ["split-criterion", "4", "1", "25%"]]
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("a,b\n1,2\n", encoding="utf-8")
    assert run("stats", wrong) == 2
    assert "is not a grades CSV from `mpkit quiz grade` (missing columns: answer_given" in capsys.readouterr().err
    header = out.read_text(encoding="utf-8").splitlines()[0]
    for bad in ("park,mp-001,model_parallel", "park,mp-001,t,p,O,O,1,1,O,extra", "park,mp-001,t,p,O,O,yes,1,O"):
        wrong.write_text(f"{header}\n{bad}\n", encoding="utf-8")
        assert run("stats", wrong) == 2  # a short, long or mangled row, not a silent 'None' row
        assert "line 2: not a row of `mpkit quiz grade`" in capsys.readouterr().err


@pytest.mark.parametrize("suffix", [".html", ".md"])
def test_sheet_has_no_answers_and_the_key_has_them(tmp_path, capsys, suffix):
    out = tmp_path / f"sheet{suffix}"
    assert run("sheet", "--bank", GOOD, "--topic", "model_parallel", "--lang", "ko", "--out", out) == 0
    key = tmp_path / f"sheet.key{suffix}"
    assert str(key) in capsys.readouterr().out
    sheet_text, key_text = out.read_text(encoding="utf-8"), key.read_text(encoding="utf-8")
    from mpkit.quiz.bank import load_bank
    items = load_bank(GOOD).select("model_parallel")
    for item in items:
        assert item.statement["ko"] in sheet_text
        assert item.explanation["ko"] not in sheet_text and item.explanation["ko"] in key_text
        if item.corrected:
            assert item.corrected["ko"] not in sheet_text and item.corrected["ko"] in key_text
    assert "정답" not in sheet_text and "해설" not in sheet_text
    answers = re.findall(r"<td><b>([OX])</b></td>" if suffix == ".html" else r"정답: ([OX])", key_text)
    assert answers == [item.answer for item in items]
    if suffix == ".html":
        for text in (sheet_text, key_text):
            assert '<meta charset="utf-8">' in text and '<html lang="ko">' in text
            assert '"Nanum Gothic"' in text and '"Noto Sans CJK KR"' in text and '"Malgun Gothic", sans-serif' in text


def test_sheet_in_english_and_bad_arguments(tmp_path, capsys):
    out = tmp_path / "s.html"
    run("sheet", "--bank", GOOD, "--items", "pp-002,mp-001", "--lang", "en", "--out", out)
    text = out.read_text(encoding="utf-8")
    assert text.index("More micro-batches m make") < text.index("Model parallelism trains")
    assert run("sheet", "--bank", GOOD, "--topic", "pipeline", "--out", tmp_path / "s.pdf") == 2
    assert run("sheet", "--bank", GOOD, "--items", "pp-001,nope", "--out", out) == 2
    assert capsys.readouterr().err.splitlines() == [
        "mpkit quiz sheet: error: --out must end in .html or .md, got 's.pdf'",
        f"mpkit quiz sheet: error: unknown item ids: nope (not in {GOOD})"]
    with pytest.raises(SystemExit):  # argparse: --items and --topic are exclusive, one is required
        run("assign", "--bank", GOOD, "--out", tmp_path / "a.ipynb")


def test_top_level_mpkit_cli_reaches_quiz(capsys):
    from mpkit.cli import main
    assert main(["quiz", "lint", "--bank", str(GOOD)]) == 0
    assert "0 errors" in capsys.readouterr().out


def _big_field_csv(path):
    path.write_text("student,item_id,topic,pitfall,answer_given,correct_answer,correct,attempts,last_answer\n"
                    f"kim,mp-001,model_parallel,x,O,O,1,1,\"{'A' * 200_000}\"\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("command, args, message", [
    ("assign", lambda d: ["--bank", GOOD, "--topic", "pipeline", "--out", d], "is a folder; give a file name like"),
    ("stats", lambda d: [d], "is a folder; give the grades CSV"),
    ("grade", lambda d: ["--bank", GOOD, d, "--out", d], "is a folder; give a file name like"),
    ("sheet", lambda d: ["--bank", GOOD, "--topic", "pipeline", "--out", d], "is a folder; give a file name like"),
    ("stats", lambda d: [_big_field_csv(d / "big.csv")], "near line 2: not a grades CSV from `mpkit quiz grade` "
                                                         "(field larger than field limit (131072))"),
    ("stats", lambda d: [d / "missing.csv"], "No such file or directory"),
], ids=["assign-out-folder", "stats-folder", "grade-out-folder", "sheet-out-folder", "csv-field-limit",
        "stats-missing"])
def test_bad_paths_give_one_line_and_exit_code_2(tmp_path, capsys, command, args, message):
    from mpkit.cli import main
    folder = tmp_path / "a-folder.ipynb" if command == "assign" else tmp_path / "grades.csv"
    folder.mkdir()
    assert main(["quiz", command, *map(str, args(folder))]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mpkit quiz {command}: error: ") and err.count("\n") == 1 and message in err, err
