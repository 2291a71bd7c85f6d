"""The multi-node path as a cluster user takes it: two torchrun "nodes" (2 processes each) on this
host meet through the c10d rendezvous and run ``mpkit run`` over 4 ranks, equal to ``single``.

This is the command lab 07 teaches; torchrun's default (static) rendezvous would give both nodes
node rank 0, so the c10d form is the one that works.
"""
import json
import os
from pathlib import Path

import pytest

from torchrun_nodes import node_command, run_nodes

ROOT = Path(__file__).resolve().parents[1]
ATOL = 1e-5  # float32 reduction order only, as in test_cli_run


@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy", ["dp", "pp"])
def test_two_torchrun_nodes_with_c10d_rendezvous_match_single(strategy, tmp_path, no_leftovers):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    logs = [(tmp_path / f"node{n}.out", tmp_path / f"node{n}.err") for n in range(2)]
    run_nodes(lambda port: node_command(port, f"mpkit-test-{strategy}-{os.getpid()}-{port}", "-m", "mpkit", "run",
                                        "--strategy", strategy, "--world-size", "4", "--steps", "3", "--json",
                                        "--compare"), logs, env, 120, ROOT)
    printed = [json.loads(line) for out, _ in logs for line in out.read_text().splitlines() if line.startswith("{")]
    assert len(printed) == 1, printed  # global rank 0 reports, on whichever node c10d made node 0
    run = printed[0]
    assert (run["strategy"], run["world_size"]) == (strategy, 4)
    assert [m["rank"] for m in run["memory"]] == [0, 1, 2, 3]  # four ranks, two per node
    assert len(run["losses"]) == 3
    assert run["compare"]["loss"] <= ATOL and run["compare"]["params"] <= ATOL, run["compare"]


def test_lab_07_teaches_the_c10d_form_for_two_nodes():
    cells = json.loads((ROOT / "labs" / "07_pytorch_api.ipynb").read_text(encoding="utf-8"))["cells"]
    text = "\n".join("".join(cell["source"]) for cell in cells).replace("\\\n", " ")
    commands = [line for line in text.splitlines() if line.startswith("torchrun") and "--nnodes" in line]
    assert commands, "lab 07 no longer shows a multi-node torchrun command"
    for command in commands:
        assert "--rdzv-backend c10d" in command and "--rdzv-id" in command and "--rdzv-endpoint" in command, command
