"""The checker judged on solutions it was not written against: tests/exercise_attempts/ holds, per
exercise, correct-but-unusual solutions (the other ring direction, other bucket orders, other valid
schedules, other return types) and typical wrong ones, written without reading the references.
Every correct one must pass; every wrong one must fail with a message naming its mistake (the
phrase next to it); none may take longer than a deadlock's timeout allows."""
import importlib
import sys
import time
from pathlib import Path

import pytest

from mpkit.exercises import EXERCISES, check

HERE = Path(__file__).parent / "exercise_attempts"
sys.path.insert(0, str(HERE))


def attempts():
    for name in EXERCISES:
        module = importlib.import_module(name)
        for fn in module.CORRECT:
            yield pytest.param(name, fn, None, id=f"{name}-ok-{_label(fn)}")
        for fn, phrase in module.WRONG:
            yield pytest.param(name, fn, phrase, id=f"{name}-wrong-{_label(fn)}")


def _label(fn):
    return "+".join(f.__name__ for f in fn) if isinstance(fn, tuple) else fn.__name__


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, fn, phrase", list(attempts()))
def test_attempt_is_judged_right(name, fn, phrase):
    started = time.monotonic()
    result = check(name, fn, lang="en", record=False)
    # a deadlock or loop ends one case at 6 s and skips the rest; 30 s is the limit on a busy machine
    assert time.monotonic() - started < 30
    if phrase is None:
        assert result.passed, result.message
    else:
        assert not result.passed, f"a wrong solution passed:\n{result.message}"
        assert phrase.lower() in result.message.lower(), result.message


def test_every_exercise_has_attempts_both_ways():
    for name in EXERCISES:
        module = importlib.import_module(name)
        assert module.CORRECT and len(module.WRONG) >= 3, name
