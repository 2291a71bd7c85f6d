"""``mpkit run``'s arguments: train one strategy and print what happened (losses, memory per rank,
bubble and communication share, and with ``--compare`` the parity with ``single``).

The work is ``run_command.main``, imported only when the command runs (torch takes seconds to
import; ``mpkit run --help`` should not wait for it).
"""
from __future__ import annotations

import argparse
import ast

from mpkit.cli.later import later
from mpkit.cli.outputs import output_file
from mpkit.registry import STRATEGIES

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
    p.set_defaults(handler=later("mpkit.cli.run_command:main"))
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
