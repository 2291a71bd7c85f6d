"""Handlers imported when they run, so building the parser imports no subcommand's work."""
from importlib import import_module


def later(target: str):
    """The handler ``"module:function"``, imported on its first call: ``mpkit --help`` and a usage error
    never import torch, nbformat or the widgets (which take seconds) for a command that will not run."""
    module_name, _, function = target.partition(":")

    def handler(args):
        return getattr(import_module(module_name), function)(args)

    handler.target = target
    return handler
