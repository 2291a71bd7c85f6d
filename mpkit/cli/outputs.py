"""Output paths checked when the command line is read, before any work starts.

A command that trains for a minute and then finds it cannot write its file has wasted the minute
and, worse, ends in a traceback. Use these as ``argparse`` types: a bad path is then argparse's
one-line error and exit code 2.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path


def output_file(text: str) -> Path:
    """A file the command will create or overwrite: not a folder, in a folder that exists and is writable."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name, e.g. {str(path / 'out.json')!r}")
    folder = path.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"folder {str(folder)!r} does not exist; create it first or write elsewhere")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: permission denied")
    return path
