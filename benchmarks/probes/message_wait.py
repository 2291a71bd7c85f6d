"""What one message costs a waiting receiver, quiet and beside busy loops: wall time against CPU.

Two ranks: rank 1 computes (spins) for ``gap`` ms, then sends 8 KiB; rank 0 only receives. Per
message, the receiver's wall time less the gap is what the message costs on the critical path,
and its CPU time (process: gloo's threads too) is what the CPU model can see. Quiet, both are
small; beside ``--load`` busy loops pinned to the cores (2 here: one per core) the wall time grows
by milliseconds while the CPU does not: the receiver waits to be scheduled, which the fair share
of CPU cannot express (the calibration fits the same measurement, ``Hardware.wake_wait``).

Then the other order: rank 0 sends first and sleeps in a receive of an acknowledgement, rank 1
computes for ``gap`` ms and only then posts its receive, so the send has waited ``gap`` for it and
the receive's notice must wake rank 0's event loop to send the data (gloo's sends are rendezvous).
Rank 1's time from posting the receive to its completion, less the link's transfer, is what the
calibration keeps as ``Hardware.late_waits``.

    python benchmarks/probes/message_wait.py [--load 2] [--messages 40]   # about 1.5 minutes on 2 cores
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: costmodel.py, _common/
from costmodel import both_conditions, condition_parser  # noqa: E402 (benchmarks/costmodel.py)
from _common.machine import load  # noqa: E402
from mpkit.costmodel.calibration import fit_wake_wait, late_waits, measure_p2p_link, wake_waits  # noqa: E402


def condition(args):
    opts = dict(timeout=120, trace=False, memory=False)
    print(f"{load()}\n| gap ms | receiver wall ms per message | wall less the gap | receiver CPU ms per message |"
          "\n|---:|---:|---:|---:|")
    points = wake_waits(opts, messages=args.messages)
    for slept, waited, cpu in points:
        print(f"| {slept * 1e3:g} | {(slept + waited) * 1e3:.2f} | {waited * 1e3:.2f} | {cpu * 1e3:.3f} |")
    wake_max, wake_tau = fit_wake_wait(points)
    print(f"fitted as the calibration does: wait = {wake_max * 1e3:.2f} ms x (1 - exp(-slept / {wake_tau * 1e3:.2f} ms))\n")
    print("| the send waited ms | the message took beyond its transfer, ms |\n|---:|---:|")
    for waited, extra in late_waits(opts, measure_p2p_link(opts), messages=args.messages):
        print(f"| {waited * 1e3:g} | {extra * 1e3:.2f} |")
    print()


def main(argv=None):
    parser = condition_parser(__doc__, load_seconds=300.0)
    parser.add_argument("--messages", type=int, default=40)
    both_conditions(condition, parser.parse_args(argv))


if __name__ == "__main__":
    main()
