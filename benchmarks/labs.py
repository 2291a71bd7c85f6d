"""How long each lab takes top to bottom in a fresh kernel (the budget: 60 s, TF lab 120 s).

Executes every ``labs/*.ipynb`` with nbclient in a temporary copy (so nothing is written
next to the committed notebooks) and prints one row per notebook.

    python benchmarks/labs.py [NOTEBOOK ...]
"""
import argparse
import shutil
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

LABS = Path(__file__).resolve().parents[1] / "labs"
BUDGET_S = {"08_tensorflow_api": 120.0}


def run_time(path: Path, workdir: Path) -> float:
    notebook = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}).execute()
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="default: every labs/*.ipynb")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.notebooks] or sorted(LABS.glob("[0-9][0-9]_*.ipynb"))
    print(f"{'notebook':<28} {'seconds':>8} {'budget':>7}")
    for path in paths:
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(LABS, Path(tmp) / "labs")
            seconds = run_time(Path(tmp) / "labs" / path.name, Path(tmp) / "labs")
        budget = BUDGET_S.get(path.stem, 60.0)
        print(f"{path.stem:<28} {seconds:>8.1f} {budget:>7.0f}{'  OVER' if seconds > budget else ''}")


if __name__ == "__main__":
    main()
