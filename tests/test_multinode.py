"""The multi-node path as a cluster user takes it: two torchrun "nodes" (2 processes each) on this
host meet through the c10d rendezvous and run ``mpkit run`` over 4 ranks, equal to ``single``.

This is the command lab 07 teaches; torchrun's default (static) rendezvous would give both nodes
node rank 0, so the c10d form is the one that works.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab_server import free_port
from procutil import descendants, listening_sockets, listening_sockets_of

ROOT = Path(__file__).resolve().parents[1]
ATOL = 1e-5  # float32 reduction order only, as in test_cli_run
# torchrun's c10d rendezvous takes an endpoint (host:port), not a socket, so the port is chosen free
# here and bound seconds later by the agent that hosts the store. Should another process take it
# in between, that bind fails (address already in use), both agents fall back to being clients of
# the stranger and the run fails or hangs until the rendezvous times out. So the test waits until
# one of our agents listens on the port (from then on it is ours) and starts both nodes again on a
# fresh port if another process holds it, at most this many times in all.
PORT_ATTEMPTS = 3


def _port_holder(port, nodes):
    """"ours" once one of the nodes' processes listens on ``port``, "other" while only another
    process does, None while nobody does."""
    if port not in listening_sockets().values():
        return None
    tree = set().union(*(descendants(node.pid) | {node.pid} for node in nodes))
    return "ours" if port in listening_sockets_of(tree).values() else "other"


def _start_nodes(strategy, logs, env, deadline):
    """Both nodes, started on rendezvous ports until our store holds one (see PORT_ATTEMPTS)."""
    for _ in range(PORT_ATTEMPTS):
        port = free_port()
        command = node_command(port, f"mpkit-test-{strategy}-{os.getpid()}-{port}", "--strategy", strategy,
                               "--world-size", "4", "--steps", "3", "--json", "--compare")
        nodes = []
        try:
            for out, err in logs:  # files, not pipes: a node blocked on a full pipe would stall both
                with open(out, "w") as out_fh, open(err, "w") as err_fh:
                    nodes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=out_fh, stderr=err_fh))
            holder = None
            while holder is None and all(node.poll() is None for node in nodes) and time.monotonic() < deadline:
                time.sleep(0.1)
                holder = _port_holder(port, nodes)
        except BaseException:
            _stop(nodes)
            raise
        if holder != "other":
            return nodes  # ours, or the nodes ended or ran out of time: the caller reports which
        _stop(nodes)
    pytest.fail(f"another process took the rendezvous port before our store bound it, {PORT_ATTEMPTS} times")


def node_command(port, run_id, *mpkit_args):
    """One node's command, exactly the form of PyTorch's docs (and lab 07)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
            "--rdzv-backend", "c10d", "--rdzv-id", run_id, "--rdzv-endpoint", f"127.0.0.1:{port}",
            "-m", "mpkit", "run", *mpkit_args]


def _stop(nodes):
    """Stop both agents and every worker they started (workers run in sessions of their own)."""
    tree = set()
    for node in nodes:
        tree |= descendants(node.pid) | {node.pid}
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for node in nodes:
        node.wait()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy", ["dp", "pp"])
def test_two_torchrun_nodes_with_c10d_rendezvous_match_single(strategy, tmp_path, no_leftovers):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    logs = [(tmp_path / f"node{n}.out", tmp_path / f"node{n}.err") for n in range(2)]
    nodes = []
    try:
        deadline = time.monotonic() + 120
        nodes = _start_nodes(strategy, logs, env, deadline)
        for node in nodes:
            node.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        _stop([node for node in nodes if node.poll() is None])
    for node, (_, err) in zip(nodes, logs):
        assert node.returncode == 0, err.read_text()[-3000:]
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
