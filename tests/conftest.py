"""Shared fixtures. ``no_leftovers``: the test fails if a launch left processes, ports or shm behind.
The exercise checker may be given mpkit's reference solutions themselves here (a learner's may not)."""
import os

import pytest

from procutil import Snapshot

os.environ.setdefault("MPKIT_EXERCISES_TRUST_REFERENCE", "1")


@pytest.fixture
def no_leftovers():
    before = Snapshot.take()
    yield
    assert before.leftovers() == []
