"""``mpkit run``: train one strategy and print what happened (losses, memory per rank, bubble
and communication share, and with ``--compare`` the parity with ``single``).

Under torchrun every rank runs this command; ``train`` returns the Run on rank 0 only, so only
rank 0 prints.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys

from mpkit.cli.outputs import output_file
from mpkit.observe.memory import CATEGORIES, mib
from mpkit.strategies import STRATEGIES
from mpkit.training import train


# The named flags of ``mpkit run``, each one of ``train``'s arguments; --option reaches the same ones.
TRAIN_FLAGS = ("strategy", "world_size", "steps", "model", "batch_size", "lr", "optimizer", "seed", "timeout",
               "checkpoint_dir", "checkpoint_every", "resume_from")


def register(subparsers):
    p = subparsers.add_parser("run", help="train one strategy on simulated devices (or GPUs) and summarise it",
                              description="Train one strategy for a few steps and print losses, memory per "
                                          "rank, bubble and communication share.")
    # No defaults here: an unset flag leaves train's default, and --option may set it instead (not both).
    p.add_argument("--strategy", required=True, choices=list(STRATEGIES))
    p.add_argument("--world-size", type=int, help="ranks (default: 1 for single, else 4; under torchrun its WORLD_SIZE)")
    p.add_argument("--steps", type=int, help="optimizer steps (default 3)")
    p.add_argument("--model", help="mlp (default) or gpt (sizes through --option, e.g. hidden=128)")
    p.add_argument("--batch-size", type=int, help="global batch (default 32)")
    p.add_argument("--lr", type=float, help="learning rate (default 0.01)")
    p.add_argument("--optimizer", help="adam (default) or sgd")
    p.add_argument("--seed", type=int, help="model and data seed (default 0)")
    p.add_argument("--timeout", type=float, help="seconds before the world is stopped (default 120)")
    p.add_argument("--checkpoint-dir", help="save checkpoints into this directory (step_000004, ...)")
    p.add_argument("--checkpoint-every", type=int, help="save after every N steps (default: after the last)")
    p.add_argument("--resume-from", help="a checkpoint (or a directory of them) to start from; 'latest': the newest "
                                         "in --checkpoint-dir, or a fresh start if it has none (an elastic restart)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", type=parse_option,
                   help="a strategy option or model size, e.g. schedule=1f1b, micro_batches=8, layers=8 (repeatable)")
    p.add_argument("--compare", action="store_true", help="also train single and print the max difference")
    p.add_argument("--chrome-trace", metavar="OUT.json", type=output_file,
                   help="write the timeline for chrome://tracing / Perfetto")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(handler=main)
    return p


def parse_option(text: str) -> tuple[str, object]:
    """``key=value``; the value is read as a Python literal when it is one (8, 0.5, True), else a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value; write e.g. --option micro_batches=8")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


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
