"""Shared fixtures. ``no_leftovers``: the test fails if a launch left processes, ports or shm behind."""
import pytest

from procutil import Snapshot


@pytest.fixture
def no_leftovers():
    before = Snapshot.take()
    yield
    assert before.leftovers() == []
