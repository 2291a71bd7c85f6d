"""mpkit.quiz.seedmap: labs/seed_map.yaml as rows and a Markdown table (the map itself: test_seed_map.py)."""
import pytest

from mpkit.quiz import seedmap


def test_rows_cover_every_claim_with_a_place_and_items():
    rows = seedmap.claims()
    assert len(rows) == 26
    for row in rows:
        assert row["section"] and row["claim"] and row["notebook"] and row["heading"]
        assert all(len(place) == 2 for place in row["also"])


def test_table_is_markdown_with_one_line_per_claim():
    table = seedmap.table()
    text = table._repr_markdown_()
    lines = text.splitlines()
    assert lines[0].startswith("| 시드 절 / seed section |") and lines[1].startswith("|---")
    assert len(lines) == 2 + len(table.rows) and str(table) == text
    assert all(line.count(" | ") >= 4 for line in lines[2:])
    assert repr(table) == f"<seed map table: {len(table.rows)} claims>"


def test_pipes_and_todo_headings_are_escaped(tmp_path):
    path = tmp_path / "map.yaml"
    path.write_text("sections:\n  - seed_heading: 'ㅇ 정의:'\n    source: 'seed: 정의'\n    claims:\n"
                    "      - {claim: 'a | b', notebook: 00_x, heading: TODO, quiz_items: [ov-001]}\n", encoding="utf-8")
    line = seedmap.table(path).markdown().splitlines()[2]
    assert "a \\| b" in line and "(작성 중 / to come)" in line and "ㅇ 정의 |" in line


def test_missing_map_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("MPKIT_SEED_MAP", str(tmp_path / "nope.yaml"))
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        seedmap.claims()
