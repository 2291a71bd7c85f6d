"""benchmarks/published.py, the planner's validation table: every row cites its source, every run
fits in memory as it was published (a memory model that refuses a layout that really ran prices it
wrongly), and the leave-one-source-out fit never sees the source it predicts."""
import pytest
from published_script import load_published


@pytest.fixture(scope="module")
def published():
    return load_published()


def test_every_published_run_fits_as_published(published):
    for run in published.RUNS:
        assert run.source and run.published > 0
        assert published.predict(run) is not None, f"{run.source} / {run.label}: the published layout does not fit"


def test_leave_one_source_out_fits_without_the_source(published):
    runs = published.RUNS
    sources = list(dict.fromkeys(r.source for r in runs))
    # a made-up grid: every run's error is its source's index at every efficiency but one, where the
    # runs of the first source are exact; a fit that saw the first source would pick that efficiency
    first = sources[0]
    grid = {i: [0.0 if (r.source == first and k == 3) else 1.0 + sources.index(r.source)
                for k in range(len(published.GRID))] for i, r in enumerate(runs)}
    result = published.leave_one_source_out(grid)
    fitted, errors = result[first]
    assert all(e is not None and e > 0 for e in errors)  # the exact efficiency was not chosen for it
    assert set(result) == set(sources) and sum(len(e) for _, e in result.values()) == len(runs)
