"""The ``mpkit`` command line: ``tour``, ``run``, ``quiz`` and ``exercise`` subcommands.

Each subcommand's arguments live in its own light module of this package (``run``, ``tour``, ``quiz``,
``exercise``), which registers them through ``register(subparsers)``; its work lives beside it
(``run_command``, ``tour_command``, ``quiz_command``, ``exercise_command``) and is imported only
when the subcommand runs (``later``), so ``mpkit --help`` and a mistyped option answer at once
instead of importing torch, nbformat and the widgets first (7-13 s). This file only wires them together.
"""
import argparse
import sys
from importlib import import_module

from mpkit.errors import DeviceOutOfMemory, LaunchError

SUBCOMMAND_MODULES = ("mpkit.cli.run", "mpkit.cli.tour", "mpkit.cli.quiz", "mpkit.cli.exercise")


def build_parser():
    parser = argparse.ArgumentParser(prog="mpkit", description="mpkit lab: model vs data parallelism, run for real.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in SUBCOMMAND_MODULES:
        import_module(module_name).register(subparsers)
    return parser


USAGE_ERROR, RUN_ERROR, INTERRUPTED = 2, 1, 130


def one_line(text) -> str:
    """A message as one line: a terminal user reads the first screen line, not a wrapped block."""
    return " ".join(str(text).split())


def _failure(exc) -> tuple[int, str] | None:
    """Exit code and message for what a command can end with; None for anything else (a bug: it
    keeps its traceback)."""
    if isinstance(exc, LaunchError):  # LaunchTimeout and RankOutOfMemory too: the summary, not a traceback
        return RUN_ERROR, exc.summary
    if isinstance(exc, DeviceOutOfMemory):  # raised by this rank itself (under torchrun)
        return RUN_ERROR, str(exc)
    if isinstance(exc, (ValueError, TypeError, FileNotFoundError)):  # bad input, found before any work
        return USAGE_ERROR, str(exc)
    if isinstance(exc, OSError):  # an output that could not be written after all (disk full, removed folder)
        where = f": {exc.filename}" if exc.filename else ""
        return RUN_ERROR, f"{exc.strerror or exc}{where}"
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED, "interrupted"
    return None


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args) or 0
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - what _failure does not know is re-raised
        failure = _failure(exc)
        if failure is None:
            raise
        code, message = failure
        print(f"mpkit {args.command}: error: {one_line(message)}", file=sys.stderr)
        return code
