"""The ``mpkit`` command line: ``tour``, ``run`` and ``quiz`` subcommands.

Each subcommand lives in its own module of this package (``run``, ``tour``, ``quiz``) and registers
itself through ``register(subparsers)``;
this file only wires them together.
"""
import argparse
import sys
from importlib import import_module

SUBCOMMAND_MODULES = ("mpkit.cli.run", "mpkit.cli.tour", "mpkit.cli.quiz")


def build_parser():
    parser = argparse.ArgumentParser(prog="mpkit", description="mpkit lab: model vs data parallelism, run for real.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in SUBCOMMAND_MODULES:
        import_module(module_name).register(subparsers)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args) or 0
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"mpkit {args.command}: error: {exc}", file=sys.stderr)
        return 2
