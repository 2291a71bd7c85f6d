"""The labs' nbval run (``labs/*.ipynb``, collected by nbval's plugin): as on a busy laptop, kept
for the website, and every drawing cell showing its figures.

For nbval's cell items only (every other test runs as before):

* ``tests/busy_load.py``: ``MPKIT_LAB_LOAD`` spinning processes per core (default 2) run while the
  labs do, and stop before any other test (no lab cell may assert a timing relation that load can
  flip; this is what would catch one);
* ``tests/executed_labs.py``: each lab's executed notebook, written to a folder made for the
  session (``MPKIT_EXECUTED_LABS``) when all its cells passed, which ``tests/test_site.py`` builds
  the website from instead of running the labs a second time;
* a cell whose source draws figures fails if it shows fewer images than it draws.

pyproject's ``testpaths`` lists ``labs`` first, so the website test finds the labs already run.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))
from busy_load import BusyLoad  # noqa: E402
from executed_labs import CACHE_ENV, Recorder, plot_problem  # noqa: E402

_LOAD: BusyLoad | None = None


def _lab_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell" and type(item.parent).__name__ == "IPyNbFile"


def pytest_configure(config):
    global _LOAD
    _LOAD = BusyLoad()  # a bad MPKIT_LAB_LOAD is a clear error here, before anything runs
    if CACHE_ENV not in os.environ:
        os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="mpkit-executed-labs-")
        config._mpkit_cache_owned = os.environ[CACHE_ENV]


def pytest_unconfigure(config):
    if _LOAD is not None:
        _LOAD.stop()
    owned = getattr(config, "_mpkit_cache_owned", None)
    if owned:
        shutil.rmtree(owned, ignore_errors=True)
        os.environ.pop(CACHE_ENV, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    if not _lab_cell(item):
        _LOAD.stop()
        return (yield)
    _LOAD.start()
    result = yield  # nbval's file setup starts the lab's kernel
    if getattr(item.parent, "_mpkit_recorder", None) is None:
        item.parent._mpkit_recorder = Recorder(item.parent)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if not _lab_cell(item):
        return (yield)
    recorder = item.parent._mpkit_recorder
    recorder.begin(item.cell_num)
    try:
        result = yield
    except BaseException:
        recorder.failed = True
        raise
    problem = plot_problem(recorder.cell(item.cell_num))
    if problem:
        recorder.failed = True
        raise AssertionError(f"{item.parent.path.name}, code cell {item.cell_num}: {problem}")
    return result


def pytest_runtest_teardown(item, nextitem):
    if _lab_cell(item) and (nextitem is None or nextitem.parent is not item.parent):
        recorder = getattr(item.parent, "_mpkit_recorder", None)
        if recorder is not None:
            recorder.save(Path(os.environ[CACHE_ENV]))
            item.parent._mpkit_recorder = None
