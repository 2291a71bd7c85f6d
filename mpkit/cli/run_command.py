"""``mpkit run``'s work: train one strategy and summarise it (text or JSON).

Under torchrun every rank runs this command; ``train`` returns the Run on rank 0 only, so only
rank 0 prints.
"""
from __future__ import annotations

import json
import sys

from mpkit.cli.run import TRAIN_FLAGS
from mpkit.observe.memory import CATEGORIES, mib
from mpkit.training import train


def train_arguments(args) -> dict:
    """The named flags and every ``--option`` as one set of ``train`` arguments, all checked by
    ``train`` alike; a name given twice (``--seed 1 --option seed=2``) is an error, not a guess."""
    kwargs = {name: getattr(args, name) for name in TRAIN_FLAGS if getattr(args, name) is not None}
    given = {name: f"--{name.replace('_', '-')} {value}" for name, value in kwargs.items()}
    for key, value in args.option:
        if key in kwargs:
            raise ValueError(f"{key} is given twice ({given[key]} and --option {key}={value!r}); give it once")
        kwargs[key], given[key] = value, f"--option {key}={value!r}"
    return kwargs


def main(args) -> int:
    run = train(**train_arguments(args))
    if run is None:  # a torchrun rank other than 0: rank 0 reports
        return 0
    comparison = run.compare_to_reference() if args.compare else None
    if args.chrome_trace:
        run.trace.to_chrome(args.chrome_trace)
    if args.json:
        json.dump(as_json(run, comparison), sys.stdout)
        print()
    else:
        print(summary(run, comparison))
        if args.chrome_trace:
            print(f"  chrome trace: {args.chrome_trace}")
    return 0


def memory_rows(run) -> list[str]:
    header = "  rank " + "".join(f"{c:>13}" for c in CATEGORIES) + "   peak (MiB)"
    rows = [header]
    for report in run.memory:
        cats = report.max_by_category
        rows.append(f"  {report.rank:>4} " + "".join(f"{mib(cats[c]):>13.3f}" for c in CATEGORIES)
                    + f"{mib(report.peak_total):>13.3f}")
    return rows


def parity_line(comparison) -> str:
    return f"parity vs single: {comparison}"


def summary(run, comparison=None) -> str:
    lines = [f"{run.strategy} on {run.world_size} rank(s) [{run.backend}], {run.config.steps} step(s)",
             "  losses: " + ", ".join(f"{x:.4f}" for x in run.losses),
             "  memory per rank, max by category (MiB):", *memory_rows(run),
             f"  bubble share {run.trace.bubble_share():.1%}, comm share {run.trace.comm_share():.1%}"]
    lines += bubble_note(run)
    if comparison is not None:
        lines.append("  " + parity_line(comparison))
    return "\n".join(lines)


def bubble_note(run) -> list[str]:
    """Why a layer-wise or pipelined run without simulated device time shows a huge bubble: its
    layers compute in microseconds, so the ranks mostly wait on messages and Python, and the share
    says little about the schedule (a newcomer read ~87% as the pipeline's bubble)."""
    if run.strategy not in ("mp", "pp") or getattr(run.config.model, "layer_ms", None) != 0:
        return []
    p, options = run.world_size, run.config.options
    m = options.get("micro_batches", 1) if run.strategy == "pp" else 1
    v = options.get("virtual_stages", 1) if options.get("schedule") == "interleaved" else 1
    return [f"  note: no simulated device time (layer_ms=0): each layer computes in microseconds, so this bubble share",
            f"        is mostly waiting on sends, receives and Python, not the schedule's (p-1)/(v·m+p-1) = "
            f"{(p - 1) / (v * m + p - 1):.1%} (p={p}, m={m}, v={v});",
            "        add --option layer_ms=20 to give every layer 20 ms of simulated device time: "
            "the share then comes close to it"]


def as_json(run, comparison=None) -> dict:
    out = {"strategy": run.strategy, "world_size": run.world_size, "backend": run.backend,
           "config": run.config.as_dict(), "losses": run.losses, "first_step": run.first_step,
           "memory": [{"rank": m.rank, "peak": m.peak_total, "max_by_category": m.max_by_category}
                      for m in run.memory],
           "bubble_share": run.trace.bubble_share(), "comm_share": run.trace.comm_share(),
           "step_times": run.step_times()}
    if comparison is not None:
        out["compare"] = {"loss": comparison.loss, "params": comparison.params, "worst_param": comparison.worst_param}
    return out
