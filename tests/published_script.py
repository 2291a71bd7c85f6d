"""benchmarks/published.py loaded as a module, for the tests that check its rows and the constants it fits."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "published.py"


def load_published():
    """The script's module (once per process: its dataclasses look their module up in sys.modules)."""
    if "published" not in sys.modules:
        spec = importlib.util.spec_from_file_location("published", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["published"] = module
        sys.path.insert(0, str(SCRIPT.parent))  # its `from _common.machine import load`
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(SCRIPT.parent))
    return sys.modules["published"]
