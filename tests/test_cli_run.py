"""``mpkit run`` and ``mpkit tour`` as a user types them (subprocesses), plus torchrun."""
import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mpkit
import mpkit.cli.run_command as cli_run
from mpkit.cli import main
from mpkit.cli.run import parse_option
from mpkit.cli.tour import TOURED
from mpkit.strategies import STRATEGIES

ROOT = Path(__file__).resolve().parents[1]
PARITY = re.compile(r"parity vs single: max \|Δloss\| = (\S+), max \|Δparam\| = (\S+) \(worst: \S+\)")
# float32 reduction-order differences only (see test_strategy_tp / test_strategy_ps)
ATOL = 1e-5


def mpkit_cli(*args, timeout=110):
    return subprocess.run([sys.executable, "-m", "mpkit", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.timeout(120)
def test_run_prints_losses_memory_per_rank_shares_and_parity(tmp_path):
    trace = tmp_path / "trace.json"
    # gpt with SGD: under Adam its zero-gradient key bias differs by ~lr (see test_strategy_tp)
    out = mpkit_cli("run", "--strategy", "tp", "--world-size", "2", "--steps", "3", "--model", "gpt",
                    "--optimizer", "sgd", "--compare", "--chrome-trace", str(trace))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("tp on 2 rank(s) [gloo], 3 step(s)")
    assert len(re.search(r"losses: (.*)", text).group(1).split(", ")) == 3
    assert re.search(r"^\s+0 .*\n\s+1 ", text, re.M)  # one memory row per rank
    assert re.search(r"bubble share \d+\.\d%, comm share \d+\.\d%", text)
    loss, param = map(float, PARITY.search(text).groups())
    assert loss <= ATOL and param <= ATOL
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {"rank 0", "rank 1"}


@pytest.mark.timeout(120)
def test_run_json_carries_options_and_model_sizes():
    out = mpkit_cli("run", "--strategy", "ps", "--world-size", "3", "--batch-size", "24", "--option", "mode=async",
                    "--option", "layers=3", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["config"]["options"] == {"mode": "async"}
    assert result["config"]["model"]["layers"] == 3  # "3" was read as the number 3
    assert len(result["losses"]) == 2 * 3  # async: one loss per push, 2 workers x 3 steps
    assert [m["rank"] for m in result["memory"]] == [0, 1, 2] and "compare" not in result


@pytest.mark.parametrize("args,message", [
    (["--strategy", "tp", "--option", "foo=1"], "option(s) ['foo'] do not apply to strategy='tp'"),
    (["--strategy", "tp", "--world-size", "3", "--model", "gpt"], "tp size world_size=3 does not divide heads=4"),
    (["--strategy", "ps", "--option", "mode"], "'mode' is not key=value"),
    (["--strategy", "warp"], "invalid choice: 'warp'"),
])
def test_run_bad_input_is_one_line_on_stderr(args, message, capsys):
    # in process (the same entry as python -m mpkit): each of these stops before any rank starts
    try:
        code = main(["run", *args])
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def _rank_1_raises(ctx):
    if ctx.rank == 1:
        raise KeyError("boom-cli")


def _recv_nobody_sends(ctx):
    if ctx.rank == 0:
        ctx.comm.recv(torch.zeros(1), 1)


def _raise(exc):
    def train(**kwargs):
        raise exc
    return train


RUN_FAILURES = {  # what train ends with -> (exit code, the one line on stderr)
    "rank raises": (lambda **kw: mpkit.launch(_rank_1_raises, 2, timeout=20),
                    1, "mpkit run: error: rank 1 failed: KeyError: 'boom-cli'"),
    # 6 s: the timeout counts from the fork and must cover starting the world (over 1 s under
    # load), or it would fire while the ranks had "not joined" and print another line
    "deadlock": (lambda **kw: mpkit.launch(_recv_nobody_sends, 2, timeout=6),
                 1, "mpkit run: error: ranks [0] had not finished after timeout=6s"),
    "write fails": (_raise(PermissionError(13, "Permission denied", "/x/trace.json")),
                    1, "mpkit run: error: Permission denied: /x/trace.json"),
    "ctrl-c": (_raise(KeyboardInterrupt()), 130, "mpkit run: error: interrupted"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("failure", RUN_FAILURES)
def test_run_failures_are_one_line_and_a_nonzero_exit(failure, monkeypatch, capsys, no_leftovers):
    fake_train, code, line = RUN_FAILURES[failure]
    monkeypatch.setattr(cli_run, "train", fake_train)
    assert main(["run", "--strategy", "dp"]) == code
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.timeout(120)
def test_run_out_of_memory_is_one_line_from_the_real_command():
    out = mpkit_cli("run", "--strategy", "dp", "--world-size", "2", "--option", "device_memory=100KiB")
    assert out.returncode == 1, out.stderr
    # Under dp both ranks hold the same bytes and run out together: the launcher reports whichever
    # failure reached it first, so either rank may be named, but the line names the same rank twice.
    assert re.match(r"mpkit run: error: rank ([01]) failed: DeviceOutOfMemory: rank \1: simulated device "
                    r"out of memory", out.stderr) and out.stderr.count("\n") == 1, out.stderr
    assert out.stdout == ""


def test_parse_option_reads_literals_else_strings():
    assert parse_option("micro_batches=8") == ("micro_batches", 8)
    assert parse_option("overlap=True") == ("overlap", True)
    assert parse_option("bucket_mb=0.5") == ("bucket_mb", 0.5)
    assert parse_option("schedule=1f1b") == ("schedule", "1f1b")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_option("=3")


TORCHRUN_WORLDS = {"given": ["--world-size", "2"], "torchrun's": []}


@pytest.fixture(scope="module")
def under_torchrun():
    """Both torchrun runs at once, each with its own standalone rendezvous: they overlap (measured:
    16 s where one after the other took 23, at load ~2; 40 s for 52 at load 9)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    procs = {name: subprocess.Popen([*torchrun, "-m", "mpkit", "run", "--strategy", "dp", *world, "--steps", "3",
                                     "--compare"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, world in TORCHRUN_WORLDS.items()}
    try:
        outputs = {name: p.communicate(timeout=150) for name, p in procs.items()}
        return {name: subprocess.CompletedProcess(p.args, p.returncode, *outputs[name]) for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", TORCHRUN_WORLDS)
def test_run_under_torchrun_reports_once_from_rank_0(world, under_torchrun):
    """Without --world-size the run takes torchrun's WORLD_SIZE (it used to ask for 4 ranks and fail)."""
    out = under_torchrun[world]
    assert out.returncode == 0, out.stderr
    lines = PARITY.findall(out.stdout)
    assert len(lines) == 1, out.stdout
    assert all(float(x) <= ATOL for x in lines[0])
    assert out.stdout.count("dp on 2 rank(s)") == 1


def test_a_world_size_that_is_not_torchruns_is_named_before_the_batch(monkeypatch):
    """Under torchrun a wrong world size is the error, not the batch it does not divide (no
    batch_size fixes it); the check comes before any process group is joined."""
    import mpkit

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"world_size=3\) inside a torchrun world of WORLD_SIZE=2: pass world_size=2"):
        mpkit.train("dp", 3)  # 3 does not divide batch_size=32 either


@pytest.mark.timeout(120)
def test_tour_runs_every_strategy_and_saves_plots(tmp_path):
    out = mpkit_cli("tour", "--out", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.split()[:1] and
            line.split()[0] in STRATEGIES}
    assert list(rows) == TOURED
    for name, row in rows.items():
        ranks, diff = row[1], float(row[3])
        assert math.isfinite(float(row[2])), row  # a finite loss
        assert ranks == ("1" if name == "single" else "4")
        assert diff <= ATOL, row  # every strategy (ps in sync mode) trains exactly like single
        assert len(row[4].split("/")) == int(ranks)  # one peak per rank
    assert {p.name for p in tmp_path.iterdir()} == {"memory.png", *(f"timeline_{s}.png" for s in TOURED)}
