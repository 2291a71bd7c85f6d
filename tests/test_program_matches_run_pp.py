"""The cost model's program and a real run agree for the looped and zero-bubble schedules too
(the same check as ``tests/test_program_matches_run.py``, whose cases list one per strategy)."""
import pytest

import mpkit
from mpkit.sim import predict
from test_program_matches_run import MACHINE, signature

CASES = [{"schedule": "looped_bfs"}, {"schedule": "interleaved_zb", "virtual_stages": 1},
         {"schedule": "interleaved_zb"}, {"schedule": "zbv"}, {"schedule": "dualpipev"}]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("options", CASES, ids=lambda o: "-".join(map(str, o.values())))
def test_predicted_and_measured_events_agree(options):
    run = mpkit.train("pp", 2, steps=2, batch_size=32, **options)
    prediction = predict("pp", hardware=MACHINE, world_size=2, batch_size=32, **options)
    for rank in range(2):
        measured, predicted = signature(run.trace.events, rank, 1), signature(prediction.trace.events, rank, 0)
        assert measured == predicted, f"rank {rank}"
        assert measured[0] and measured[2], "a step with no compute or no message"
