"""Faults -> seconds to a clear error, and what 100 launches leave behind.

For each fault a rank (or its caller) can suffer, the time from the fault to the caller holding
the error (or, for a killed caller, to the last rank, child and port being gone); medians over
``--reps`` runs. Then 100 launches in a row and the processes, threads, fds, listening sockets and
/dev/shm entries they leave, and the cost of the lifeline (the guardian process) per launch.

    python benchmarks/faults.py [--reps 5] [--timeout 2]
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout, not installed
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import mpkit  # noqa: E402
from mpkit.runtime.lifeline import Guardian  # noqa: E402
from _common.machine import load, machine_info  # noqa: E402  (also puts the checkout on sys.path)
from procutil import descendants, fd_count, is_running, listening_sockets, socket_inodes, thread_count  # noqa: E402

_MARK = Path(tempfile.gettempdir()) / f"mpkit-fault-{os.getpid()}"


def _mark_fault():
    """The moment of the fault, on the clock every process of this host shares."""
    _MARK.write_text(repr(time.monotonic()))


def _raise(ctx):
    raise KeyError("boom")


def _exit(ctx):
    os._exit(3)


def _sigkill(ctx):
    os.kill(os.getpid(), signal.SIGKILL)


def _out_of_memory(ctx):
    with ctx.memory.track():
        torch.empty(2**20)


def _nested(ctx):
    mpkit.launch(lambda inner: 0, 2)


def _hang(ctx):
    time.sleep(3600)


def _recv_from_0(ctx):
    ctx.comm.recv(torch.zeros(1), 0)  # rank 0 returns without sending


def _barrier(ctx):
    dist.barrier()  # a stray barrier rank 0 never enters


def _faulty(ctx, fault, ranks):
    """``fault`` on ``ranks`` (the first marks the moment); the other ranks return."""
    if ctx.rank in ranks:
        if ctx.rank == ranks[0]:
            _mark_fault()
        fault(ctx)
    return ctx.rank


def faults(timeout):
    """name -> (fault, the ranks it hits, launch kwargs, expected error class)."""
    return {
        "rank raises": (_raise, (1,), {}, mpkit.LaunchError),
        "rank exits (os._exit)": (_exit, (1,), {}, mpkit.LaunchError),
        "rank killed (SIGKILL)": (_sigkill, (1,), {}, mpkit.LaunchError),
        "rank out of simulated memory": (_out_of_memory, (1,), {"device_memory": "1MiB"}, mpkit.DeviceOutOfMemory),
        "launch inside a rank": (_nested, (1,), {}, mpkit.LaunchError),
        f"rank hangs (timeout={timeout:g}s)": (_hang, (1,), {"timeout": timeout}, mpkit.LaunchTimeout),
        f"recv nobody sends (timeout={timeout:g}s)": (_recv_from_0, (1,), {"timeout": timeout}, mpkit.LaunchTimeout),
        f"stray barrier (timeout={timeout:g}s)": (_barrier, (1, 2), {"timeout": timeout}, mpkit.LaunchTimeout),
    }


def time_to_error(fault, ranks, kwargs, error) -> float:
    _MARK.unlink(missing_ok=True)
    try:
        mpkit.launch(_faulty, 3, args=(fault, ranks), **{"timeout": 30, **kwargs})
    except error:
        caught = time.monotonic()
    else:
        raise AssertionError(f"{fault.__name__}: no {error.__name__}")
    return caught - float(_MARK.read_text())


CALLER = '''
import sys, time
from pathlib import Path
import mpkit

def fn(ctx, out):
    if ctx.rank == 0:
        import subprocess
        Path(out, "child").write_text(str(subprocess.Popen(["sleep", "120"]).pid))
    Path(out, f"rank{ctx.rank}").write_text("")
    while True:
        pass

mpkit.launch(fn, 3, args=(sys.argv[1],), timeout=120)
'''


def time_to_clean_after_caller_killed(sig) -> float:
    """Seconds from killing the caller until no rank, rank child or store port of it remains."""
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        caller = subprocess.Popen([sys.executable, "-c", CALLER, out], env=env, start_new_session=True)
        try:
            ready = [Path(out, name) for name in ("rank0", "rank1", "rank2", "child")]
            while not all(p.exists() for p in ready):
                time.sleep(0.02)
            tree = descendants(caller.pid)
            ports = {i for i in listening_sockets() if i in socket_inodes(tree)}
            os.kill(caller.pid, sig)
            killed = time.monotonic()
            while any(is_running(p) for p in tree) or ports & set(listening_sockets()):
                if time.monotonic() - killed > 30:
                    raise AssertionError(f"left behind: {[p for p in tree if is_running(p)]}")
                time.sleep(0.005)
            return time.monotonic() - killed
        finally:
            caller.kill()
            caller.wait()


def leaks_after(n=100) -> tuple[dict, float]:
    work = lambda ctx: ctx.rank  # noqa: E731
    mpkit.launch(work, 2, timeout=30)  # warm-up: lazy imports open their files once

    def snapshot():
        tree = descendants()
        return {"processes": len(tree), "threads": thread_count(), "fds": fd_count(),
                "listening sockets": len(socket_inodes({os.getpid(), *tree}) & set(listening_sockets())),
                "/dev/shm entries": len(os.listdir("/dev/shm"))}

    before = snapshot()
    start = time.perf_counter()
    for _ in range(n):
        assert mpkit.launch(work, 2, timeout=30) == [0, 1]
    per_launch = (time.perf_counter() - start) / n
    after = snapshot()
    return {k: after[k] - before[k] for k in before}, per_launch


def bad_input_seconds() -> list[float]:
    """Seconds for ``train`` and ``launch`` to refuse each case of tests/test_bad_inputs.py."""
    from test_bad_inputs import LAUNCH, TRAIN

    calls = [(mpkit.train, {"strategy": "dp", "world_size": 2, **kwargs}) for kwargs, _ in TRAIN]
    calls += [(mpkit.launch, {"fn": lambda ctx: 0, "world_size": 2, "timeout": 10, **kwargs}) for kwargs, *_ in LAUNCH]
    times = []
    for call, kwargs in calls:
        start = time.perf_counter()
        try:
            call(**kwargs)
        except (ValueError, TypeError):
            times.append(time.perf_counter() - start)
        else:
            raise AssertionError(f"accepted: {kwargs}")
    return times


def guardian_cost(reps=50) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        guardian = Guardian()
        guardian.release()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=2.0)
    opts = parser.parse_args()
    print(machine_info())
    print(f"3 ranks; medians of {opts.reps} runs; seconds from the fault to the error in the caller\n")
    print("| fault | error | median s | max s |\n|---|---|---:|---:|")
    for name, (fault, ranks, kwargs, error) in faults(opts.timeout).items():
        times = [time_to_error(fault, ranks, kwargs, error) for _ in range(opts.reps)]
        print(f"| {name} | {error.__name__} | {statistics.median(times):.3f} | {max(times):.3f} |", flush=True)
    for sig in (signal.SIGKILL, signal.SIGTERM):
        times = [time_to_clean_after_caller_killed(sig) for _ in range(opts.reps)]
        print(f"| caller killed ({sig.name}) | ranks, rank's child, store port gone | "
              f"{statistics.median(times):.3f} | {max(times):.3f} |", flush=True)
    _MARK.unlink(missing_ok=True)
    refused = bad_input_seconds()
    print(f"| bad input ({len(refused)} cases of train/launch) | ValueError/TypeError, no rank started | "
          f"{statistics.median(refused):.5f} | {max(refused):.5f} |")

    leaks, per_launch = leaks_after(100)
    print("\n100 launches of 2 ranks, left behind (after - before): "
          + ", ".join(f"{k} {v:+d}" for k, v in leaks.items()) + f"; {per_launch * 1e3:.0f} ms per launch")
    print(f"lifeline (guardian start + release) per launch: {guardian_cost() * 1e3:.1f} ms median")
    print(f"\nafter: {load()}")


if __name__ == "__main__":
    main()
