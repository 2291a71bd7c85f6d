"""Two torchrun "nodes" on this host, meeting through the c10d rendezvous (the form lab 07 teaches),
started and stopped as a test needs them: ``test_multinode`` (``mpkit run`` over 4 ranks) and
``test_checkpoint_elastic`` (a job that loses a rank and restarts from its checkpoint)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from lab_server import free_port
from procutil import descendants, listening_sockets, listening_sockets_of

# torchrun's c10d rendezvous takes an endpoint (host:port), not a socket, so the port is chosen free
# here and bound seconds later by the agent that hosts the store. Should another process take it
# in between, that bind fails (address already in use), both agents fall back to being clients of
# the stranger and the run fails or hangs until the rendezvous times out. So the test waits until
# one of our agents listens on the port (from then on it is ours) and starts both nodes again on a
# fresh port if another process holds it, at most this many times in all.
PORT_ATTEMPTS = 3


def port_holder(port, nodes):
    """"ours" once one of the nodes' processes listens on ``port``, "other" while only another
    process does, None while nobody does."""
    if port not in listening_sockets().values():
        return None
    tree = set().union(*(descendants(node.pid) | {node.pid} for node in nodes))
    return "ours" if port in listening_sockets_of(tree).values() else "other"


def start_nodes(command, logs, env, deadline, cwd):
    """Both nodes, each running ``command(port)``, started on rendezvous ports until our store holds
    one (see PORT_ATTEMPTS)."""
    for _ in range(PORT_ATTEMPTS):
        port = free_port()
        nodes = []
        try:
            for out, err in logs:  # files, not pipes: a node blocked on a full pipe would stall both
                with open(out, "w") as out_fh, open(err, "w") as err_fh:
                    nodes.append(subprocess.Popen(command(port), cwd=cwd, env=env, stdout=out_fh, stderr=err_fh))
            holder = None
            while holder is None and all(node.poll() is None for node in nodes) and time.monotonic() < deadline:
                time.sleep(0.1)
                holder = port_holder(port, nodes)
        except BaseException:
            stop(nodes)
            raise
        if holder != "other":
            return nodes  # ours, or the nodes ended or ran out of time: the caller reports which
        stop(nodes)
    pytest.fail(f"another process took the rendezvous port before our store bound it, {PORT_ATTEMPTS} times")


def run_nodes(command, logs, env, seconds, cwd) -> None:
    """Both nodes started (``start_nodes``), waited for up to ``seconds`` in all and stopped; each
    must have exited 0 (else its stderr's end is the failure)."""
    nodes = []
    try:
        deadline = time.monotonic() + seconds
        nodes = start_nodes(command, logs, env, deadline, cwd)
        for node in nodes:
            node.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        stop([node for node in nodes if node.poll() is None])
    for node, (_, err) in zip(nodes, logs):
        assert node.returncode == 0, err.read_text()[-3000:]


def node_command(port, run_id, *program, nproc=2, restarts=0):
    """One node's command, exactly the form of PyTorch's docs (and lab 07); ``program``: what each
    worker runs (``"-m", "mpkit", "run", ...`` or a script and its arguments). ``restarts``: torchrun
    restarts the workers up to that many times."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", str(nproc),
            *(["--max-restarts", str(restarts)] if restarts else []),
            "--rdzv-backend", "c10d", "--rdzv-id", run_id, "--rdzv-endpoint", f"127.0.0.1:{port}", *program]


def stop(nodes):
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
