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


def test_assign_writes_a_valid_nbgrader_notebook_that_runs(tmp_path, monkeypatch, capsys):
    out = tmp_path / "hw" / "assignment.ipynb"
    assert run("assign", "--bank", GOOD, "--topic", "all", "--n", "4", "--seed", "7", "--out", out) == 0
    assert "4 items, mode=exam, lang=ko" in capsys.readouterr().out
    nb = nbformat.read(out, as_version=4)
    nbformat.validate(nb)
    grade_ids = []
    for cell in nb.cells:
        meta = cell.metadata["nbgrader"]
        jsonschema.validate(meta, NBGRADER_V3)
        assert ("points" in meta) == meta["grade"]
        grade_ids.append(meta["grade_id"])
    assert len(set(grade_ids)) == len(grade_ids)
    graded = [c for c in nb.cells if c.metadata["nbgrader"]["grade"]]
    assert len(graded) == 1 and graded[0].metadata["nbgrader"]["points"] == 4 and graded[0].metadata["nbgrader"]["locked"]
    assert "한국어" in nb.cells[0].source and "English" in nb.cells[0].source
    quiz_cells = [c for c in nb.cells if c.cell_type == "code" and "quiz.show(" in c.source]
    ids = [i for c in quiz_cells for i in re.findall(r"'([a-z]+-\d+)'", c.source)]
    assert len(ids) == 4 and all("mode='exam'" in c.source and "lang='ko'" in c.source for c in quiz_cells)
    again = tmp_path / "again.ipynb"
    run("assign", "--bank", GOOD, "--topic", "all", "--n", "4", "--seed", "7", "--out", again)
    assert [c.source for c in nbformat.read(again, as_version=4).cells] == [c.source for c in nb.cells]

    # Run the notebook's code the way a student would: answer everything with "O" and submit.
    monkeypatch.setenv("MPKIT_QUIZ_DIR", str(GOOD))
    monkeypatch.delenv("MPKIT_RESULTS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    exec(code[0], namespace)
    for source in code[1:-1]:
        shown = eval(source, namespace)
        for item in shown.items:
            shown.answer(item.id, "O")
        shown.submit()
    from mpkit.quiz.bank import load_bank
    expected = sum(load_bank(GOOD).items[i].answer == "O" for i in ids)
    assert eval(code[-1], namespace) == expected


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
    (folder / "kim.corrupt-20250101T000000.json").write_text("{", encoding="utf-8")  # moved aside: skipped
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
    assert list(rows[0]) == ["student", "item_id", "topic", "pitfall", "answer_given", "correct_answer", "correct"]
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
    with pytest.raises(ValueError, match="is not a grades CSV from `mpkit quiz grade`"):
        run("stats", wrong)


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


def test_sheet_in_english_and_bad_arguments(tmp_path):
    out = tmp_path / "s.html"
    run("sheet", "--bank", GOOD, "--items", "pp-002,mp-001", "--lang", "en", "--out", out)
    text = out.read_text(encoding="utf-8")
    assert text.index("More micro-batches m make") < text.index("Model parallelism trains")
    with pytest.raises(ValueError, match="--out must end in .html or .md"):
        run("sheet", "--bank", GOOD, "--topic", "pipeline", "--out", tmp_path / "s.pdf")
    with pytest.raises(ValueError, match="unknown item ids: nope"):
        run("sheet", "--bank", GOOD, "--items", "pp-001,nope", "--out", out)
    with pytest.raises(SystemExit):  # argparse: --items and --topic are exclusive, one is required
        run("assign", "--bank", GOOD, "--out", tmp_path / "a.ipynb")


def test_top_level_mpkit_cli_reaches_quiz(capsys):
    from mpkit.cli import main
    assert main(["quiz", "lint", "--bank", str(GOOD)]) == 0
    assert "0 errors" in capsys.readouterr().out
