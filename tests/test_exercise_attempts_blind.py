"""The checker judged by a second, blind set of attempts (issue 41, "How this is measured"):
tests/exercise_attempts_blind/<exercise>.py holds correct-but-unusual solutions (CORRECT) and typical
mistakes (WRONG, each with the phrases a message naming it would contain), written by someone who had
not seen the references. Every correct one must pass, every wrong one fail, each check within 10 s, and
at least 90% of the wrong ones must get a message that names their mistake."""
import importlib.util
import time
from functools import lru_cache
from pathlib import Path

import pytest

from mpkit.exercises import check

HERE = Path(__file__).parent / "exercise_attempts_blind"
NAMES = sorted(p.stem for p in HERE.glob("*.py"))
TIMEOUT = 6.0        # the checker's default wait for a stuck case
LIMIT = 10.0         # the limit on one check


def _label(fn):
    return "+".join(f.__name__ for f in fn) if isinstance(fn, tuple) else fn.__name__


def _attempts():
    for name in NAMES:
        # a name of its own: tests/exercise_attempts/ holds modules of the same names (one pytest run imports both)
        spec = importlib.util.spec_from_file_location(f"blind_{name}", HERE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for fn in module.CORRECT:
            yield name, fn, None
        for fn, phrases in module.WRONG:
            yield name, fn, phrases


ATTEMPTS = list(_attempts())


@lru_cache(maxsize=None)
def _judged(name, fn):
    """Each attempt is checked once, shared by its own test and the hit-rate test."""
    started = time.monotonic()
    result = check(name, fn, lang="en", record=False)
    return result, time.monotonic() - started


def _feedback(message):
    """The checker's words without the learner's own code quoted in a traceback (an attempt's name or
    source line must not count as a hint)."""
    lines, skip = [], False
    for line in message.splitlines():
        if line.strip().startswith('File "'):
            skip = True
            continue
        if skip or set(line.strip()) <= set("^~ "):
            skip = False
            continue
        lines.append(line)
    return "\n".join(lines).lower()


def _names_mistake(message, phrases):
    text = _feedback(message)
    return any(p.lower() in text for p in phrases)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, fn, phrases", ATTEMPTS,
                         ids=[f"{n}-{'wrong' if p else 'ok'}-{_label(f)}" for n, f, p in ATTEMPTS])
def test_blind_attempt_is_judged_right(name, fn, phrases):
    result, seconds = _judged(name, fn)
    # a deadlock is stopped at the checker's timeout and the remaining cases are skipped, so such a
    # check may take the timeout on top of the limit
    stuck = any(words in result.message for words in ("did not finish", "got stuck", "no rank could go on"))
    assert seconds < LIMIT + (TIMEOUT if stuck else 0), f"{seconds:.1f} s\n{result.message}"
    if phrases is None:
        assert result.passed, f"a correct solution was rejected:\n{result.message}"
    else:
        assert not result.passed, f"a wrong solution passed:\n{result.message}"


@pytest.mark.timeout(900)
def test_most_wrong_attempts_get_a_message_naming_their_mistake():
    wrong = [(name, fn, phrases) for name, fn, phrases in ATTEMPTS if phrases is not None]
    misses = []
    for name, fn, phrases in wrong:
        result, _ = _judged(name, fn)
        if result.passed or not _names_mistake(result.message, phrases):
            misses.append(f"{name} / {_label(fn)} (wanted one of {phrases}):\n{result.message}")
    for miss in misses:
        print(miss, end="\n\n")
    hit_rate = 1 - len(misses) / len(wrong)
    assert hit_rate >= 0.9, f"{len(misses)} of {len(wrong)} wrong attempts got no message naming the mistake"
