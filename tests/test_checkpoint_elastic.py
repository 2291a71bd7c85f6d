"""An elastic restart for real: two torchrun "nodes" on this host (c10d rendezvous, one rank each,
``--max-restarts 2``) train ``dp`` for 8 steps, checkpointing every 2; rank 1 kills itself (SIGKILL)
as it starts step 5. Its agent restarts it, rank 0's peer sees the connection close and fails, its
agent restarts it too; the new round resumes from the last checkpoint (step 4), replays steps 4
and 5, and finishes with exactly the parameters of a run that never failed (same layout: the same
ops on the same values; tolerance 0). The history in the checkpoint directory shows the failure,
the restart and the replayed steps."""
import json
import os
from pathlib import Path

import pytest

import mpkit
from mpkit.models import ModelConfig
from mpkit.parallel import checkpoint
from mpkit.strategies.checkpointing import read_history
from torchrun_nodes import node_command, run_nodes

ROOT = Path(__file__).resolve().parents[1]
STEPS, EVERY, FAIL_STEP = 8, 2, 5
RESTART_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # a fresh store per rendezvous round


@pytest.mark.timeout(300)
def test_a_killed_rank_restarts_from_the_last_checkpoint_and_ends_as_if_nothing_happened(tmp_path, no_leftovers):
    directory = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           # torch 2.13's c10d rendezvous keeps one TCPStore for every round and the restarted workers
           # read the dead round's keys (a peer's old port: "Connection refused"); pytorch/pytorch#135712
           **RESTART_ENV}
    logs = [(tmp_path / f"node{n}.out", tmp_path / f"node{n}.err") for n in range(2)]
    program = ["-m", "mpkit", "run", "--strategy", "dp", "--world-size", "2", "--steps", str(STEPS),
               "--checkpoint-dir", str(directory), "--checkpoint-every", str(EVERY), "--resume-from", "latest",
               "--option", f"simulate_failure=({FAIL_STEP}, 1)", "--json"]
    run_nodes(lambda port: node_command(port, f"mpkit-elastic-{os.getpid()}-{port}", *program, nproc=1, restarts=2),
              logs, env, 270, ROOT)

    events = read_history(directory)
    starts = [i for i, e in enumerate(events) if e["event"] == "start"]
    assert len(starts) == 2, events  # the first attempt, and the one after the restart
    first, second = events[:starts[1]], events[starts[1]:]
    assert [(e["event"], e["step"]) for e in first] == [
        ("start", 0), ("step", 0), ("step", 1), ("save", 2), ("step", 2), ("step", 3), ("save", 4), ("step", 4),
        ("step", 5)]  # rank 0 started step 5 and never finished it: its peer had died
    assert second[0]["step"] == 4 and second[0]["pid"] != first[0]["pid"]  # a new process of rank 0
    assert [e["step"] for e in second if e["event"] == "step"] == [4, 5, 6, 7]  # 4 and 5 replayed
    assert (second[-1]["event"], second[-1]["step"]) == ("end", STEPS)

    printed = [json.loads(line) for out, _ in logs for line in out.read_text().splitlines() if line.startswith("{")]
    assert len(printed) == 1 and printed[0]["first_step"] == 4, printed  # rank 0 of the last round reports
    uninterrupted = mpkit.train("dp", world_size=2, steps=STEPS)
    assert printed[0]["losses"] == uninterrupted.losses[4:]
    final = ModelConfig(kind="mlp").build(0)
    assert checkpoint.load(directory / f"step_{STEPS:06d}", final).step == STEPS
    for name, tensor in final.state_dict().items():
        assert (tensor - uninterrupted.params[name]).abs().max().item() == 0.0, name
