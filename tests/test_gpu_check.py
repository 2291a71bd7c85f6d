"""benchmarks/gpu_check.py, the script a GPU machine runs: its no-GPU message, and its steps
rehearsed on CPU processes so it cannot rot where CI has no GPU."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_gpu_it_says_so_and_exits_1(gpu_check, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "cuda_count", lambda: 0)
    assert gpu_check.main([]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("gpu_check: no CUDA GPU is visible here") and "--cpu-rehearsal" in captured.err


@pytest.mark.timeout(120)
def test_cpu_rehearsal_runs_every_step(gpu_check, capsys, no_leftovers):
    assert gpu_check.main(["--cpu-rehearsal"]) == 0
    out = capsys.readouterr().out
    assert "rank 0 on cpu (CPU), backend gloo, all_reduce -> 1: ok" in out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ")]
    results = {(r[0].strip(), r[1].strip()): r[2].strip() for r in rows if len(r) == 7 and r[1].strip().isdigit()}
    assert results[("ps", "1")].startswith("does not apply: ps needs a server")
    assert results[("sp", "1")].startswith("does not apply: strategy='sp' needs world_size >= 2")
    assert all(value == "ok" for key, value in results.items() if key not in (("ps", "1"), ("sp", "1"))), results
    assert len(results) == 25  # single + 12 strategies on 1 rank, 12 on 2 ranks (sp, cp, ep on the gpt)
    assert "| 8 |" in out and out.rstrip().endswith("s)") and "all checks passed" in out
