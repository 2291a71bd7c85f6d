"""``mpkit tour``: simulated device time so the bubble column teaches what lab 04 does, the caveat
that says so, ``--lang``, and a bad ``--out`` refused before anything trains."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpkit.cli import main
from mpkit.cli import tour, tour_command
from mpkit.i18n import t
from mpkit.strategies import STRATEGIES

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("make", [
    lambda tmp: tmp / "plots.png",                # an existing file
    lambda tmp: tmp / "plots.png" / "sub",        # a folder below a file
])
def test_out_that_cannot_be_a_folder_fails_in_one_line_before_any_training(tmp_path, monkeypatch, capsys, make):
    (tmp_path / "plots.png").write_bytes(b"not a folder")
    out = make(tmp_path)
    trained = []
    monkeypatch.setattr(tour_command, "train", lambda *a, **k: trained.append(a))
    assert main(["tour", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert trained == [] and captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(f"mpkit tour: error: --out {out} ")
    assert "pass a folder for the PNGs" in captured.err


def test_no_plots_ignores_out(tmp_path, monkeypatch):
    (tmp_path / "plots.png").write_bytes(b"x")
    monkeypatch.setattr(tour_command, "train", lambda *a, **k: (_ for _ in ()).throw(ValueError("stop here")))
    # --no-plots never writes to --out, so it is not checked; the (stubbed) training is reached
    assert main(["tour", "--no-plots", "--out", str(tmp_path / "plots.png")]) == 1


def test_every_strategy_gets_simulated_device_time_and_pp_its_micro_batches():
    settings = tour.tour_settings(4)
    assert settings["layer_ms"] == tour.LAYER_MS > 0
    assert settings["batch_size"] % tour.MICRO_BATCHES == 0
    assert tour.strategy_options("pp", 4)["micro_batches"] == tour.MICRO_BATCHES
    assert tour.strategy_options("3d", 4) == {"dp": 2, "pp": 2, "tp": 1, "micro_batches": 4}
    assert tour.strategy_options("3d", 8) == {"dp": 2, "pp": 2, "tp": 2, "micro_batches": 4}


def test_table_aligns_wide_characters():
    lines = tour.table(["전략", "x"], [["pp", "1"], ["single", "2"]]).splitlines()
    # the last column starts at the same terminal column on every line (Hangul is two columns wide)
    assert [tour._width(line[:line.rindex(" ") + 1]) for line in lines] == [8, 8, 8, 8]


def test_lang_must_be_ko_or_en(capsys):
    with pytest.raises(SystemExit):
        main(["tour", "--lang", "fr"])
    assert "invalid choice: 'fr'" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_korean_tour_shows_the_pipeline_bubble_far_below_mp_and_the_caveat():
    """The whole tour, as a user runs it: the bubble column says what lab 04 says."""
    # 2 ranks keep it short; test_cli_run runs the default 4-rank tour with plots
    out = subprocess.run([sys.executable, "-m", "mpkit", "tour", "--no-plots", "--lang", "ko", "--world-size", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("mpkit tour: 시뮬레이션 장치 2개")
    assert lines[2].split()[:3] == ["전략", "랭크", "마지막"]
    rows = {line.split()[0]: line.split() for line in lines if line.split()[:1] and line.split()[0] in STRATEGIES}
    assert list(rows) == tour.TOURED
    bubble = {name: int(row[5].rstrip("%")) / 100 for name, row in rows.items()}
    p, m = 2, tour.MICRO_BATCHES
    # layer-wise: one device at a time, (p-1)/p = 50%; pp: (p-1)/(m+p-1) = 11% plus a few ms per
    # message and wake-up, which a loaded machine stretches (4 ranks: 38-57% against 75% at load
    # 8-15): the lesson is the order, with a margin no load has closed
    assert bubble["mp"] >= 0.4, bubble
    assert bubble["pp"] <= bubble["mp"] - 0.15, bubble
    assert t("tour_caveat", "ko", ms=tour.LAYER_MS, m=m, p=p) in out.stdout
    assert re.search(r"^주의: 시뮬레이션 장치 시간입니다", out.stdout, re.M)
