"""``mpkit run`` on a layer-wise or pipelined strategy without simulated device time says why its
bubble share is huge (the layers compute in microseconds) and what the schedule alone would give."""
from types import SimpleNamespace

import pytest

import mpkit
from mpkit.cli.run_command import bubble_note, summary


def fake(strategy, world_size=4, layer_ms=0.0, **options):
    return SimpleNamespace(strategy=strategy, world_size=world_size,
                           config=SimpleNamespace(model=SimpleNamespace(layer_ms=layer_ms), options=options))


@pytest.mark.parametrize("run,formula", [
    (fake("pp", schedule="1f1b", micro_batches=4), "(p-1)/(v·m+p-1) = 42.9% (p=4, m=4, v=1)"),
    (fake("pp", schedule="interleaved", micro_batches=8, virtual_stages=2), "= 15.8% (p=4, m=8, v=2)"),
    (fake("mp"), "= 75.0% (p=4, m=1, v=1)"),
])
def test_the_note_gives_the_schedule_bubble(run, formula):
    note = "\n".join(bubble_note(run))
    assert "no simulated device time (layer_ms=0)" in note and formula in note and "--option layer_ms=20" in note


@pytest.mark.parametrize("run", [fake("pp", layer_ms=20.0, micro_batches=4), fake("dp"), fake("tp"),
                                 SimpleNamespace(strategy="pp", world_size=2,   # a user model: no layer_ms to speak of
                                                 config=SimpleNamespace(model=SimpleNamespace(), options={}))])
def test_no_note_with_device_time_or_without_a_schedule(run):
    assert bubble_note(run) == []


@pytest.mark.timeout(60)
def test_a_real_pipelined_run_prints_the_note():
    run = mpkit.train("pp", world_size=2, steps=1, micro_batches=2)
    text = summary(run)
    assert text.index("bubble share") < text.index("note: no simulated device time")
    assert "(p-1)/(v·m+p-1) = 33.3% (p=2, m=2, v=1)" in text
