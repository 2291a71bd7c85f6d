"""3D parallelism (``strategy="3d"``): data x pipeline x tensor parallel on one DeviceMesh.

Parity with ``single`` for every layout of 4 ranks and for 2x2x2 on 8. Tolerances as in the tp
and pp tests: SGD keeps every difference at float32 rounding level (the TP row-parallel sums and
the DP/micro-batch averages add the same numbers in another order), so parameters agree to 1e-6;
Adam would turn rounding noise in the gpt's key bias into steps of ~0.1·lr, so Adam is checked
through the losses.
"""
import functools

import matplotlib
import pytest

import mpkit

matplotlib.use("Agg")

LOSS_ATOL, PARAM_ATOL = 1e-5, 1e-6
LAYOUTS_4 = [(2, 2, 1), (2, 1, 2), (1, 2, 2), (4, 1, 1), (1, 4, 1), (1, 1, 4)]  # (dp, tp, pp)


@functools.cache
def run3d(dp, tp, pp, optimizer="sgd", **options):
    return mpkit.train("3d", dp * tp * pp, model="gpt", steps=2, dp=dp, tp=tp, pp=pp, optimizer=optimizer,
                       timeout=200, **options)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dp,tp,pp", LAYOUTS_4, ids=lambda v: str(v))
def test_every_four_rank_layout_matches_single(dp, tp, pp):
    cmp = run3d(dp, tp, pp).compare_to_reference()
    assert cmp.loss <= LOSS_ATOL and cmp.params <= PARAM_ATOL, cmp


@pytest.mark.timeout(280)
def test_two_by_two_by_two_on_eight_ranks():
    run = run3d(2, 2, 2)
    cmp = run.compare_to_reference()
    assert cmp.loss <= LOSS_ATOL and cmp.params <= PARAM_ATOL, cmp
    assert str(run.mesh) == "dp=2 x pp=2 x cp=1 x tp=2"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("options", [dict(zero=True), dict(schedule="interleaved", micro_batches=2),
                                     dict(schedule="gpipe", micro_batches=4)], ids=str)
def test_zero_and_other_schedules_match_single(options):
    dp, tp, pp = (2, 1, 2)
    cmp = run3d(dp, tp, pp, **options).compare_to_reference()
    assert cmp.loss <= LOSS_ATOL and cmp.params <= PARAM_ATOL, cmp


@pytest.mark.timeout(240)
def test_adam_losses_match_single():
    assert run3d(2, 2, 1, optimizer="adam").compare_to_reference().loss <= LOSS_ATOL


@pytest.mark.timeout(280)
def test_each_dimension_talks_in_its_own_groups():
    """TP groups are adjacent ranks, PP pairs ranks tp apart, DP ranks tp*pp apart; every traced
    collective or message names the dimension of its group."""
    run = run3d(2, 2, 2)
    mesh = run.mesh
    assert mesh.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mesh.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    step = run.trace.filter(step=1).events
    by_kind = {}
    for e in step:
        if e.category == "comm":
            by_kind.setdefault(e.kind, set()).add(e.group)
    assert by_kind["send"] == by_kind["recv"] == {"pp"}  # activations between stages
    assert by_kind["all_reduce"] == {"tp", "dp"}  # Megatron's f/g, and the gradient average
    for rank in range(8):
        coords = mesh.coords(rank)
        assert run.extra[rank]["coords"] == coords
        assert run.extra[rank]["stages"] == [coords["pp"]]


@pytest.mark.timeout(280)
def test_plots_group_ranks_by_mesh_and_colour_dimensions():
    from mpkit.plot.style import GROUP_COLOURS

    run = run3d(2, 2, 2)
    fig = mpkit.plot.timeline(run, step=1)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()][5] == "rank 5 (dp 1 · pp 0 · tp 1)"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"tensor-parallel comm (tp)", "pipeline comm (pp)", "data-parallel comm (dp)"} <= set(legend)
    colours = {tuple(round(c, 3) for c in p.get_facecolor()[:3]) for p in ax.patches if p.get_gid() == "comm"}
    expected = {tuple(round(int(h[i:i + 2], 16) / 255, 3) for i in (1, 3, 5))
                for h in (GROUP_COLOURS[g] for g in ("tp", "pp", "dp"))}
    assert expected <= colours
    memory = mpkit.plot.memory({"2x2x1": run3d(2, 2, 1), "1x2x2": run3d(1, 2, 2)})
    assert len(memory.axes[0].get_xticklabels()) == 8  # four ranks of each layout, side by side


@pytest.mark.parametrize("options,message", [
    (dict(world_size=4, dp=2, tp=2, pp=2), r"dp\*pp\*cp\*tp = 2\*2\*1\*2 = 8 ranks, but world_size=4"),
    (dict(world_size=3, dp=1, tp=3, pp=1), r"tp size tp=3 does not divide heads=4"),
    (dict(world_size=8, dp=1, tp=1, pp=8), r"pp=8 is more than the 6 layers of the model; use pp<=6"),
    (dict(world_size=2, dp=1, tp=1, pp=2, zero=True), r"zero=True shards over the dp x cp ranks, and dp\*cp = 1"),
    (dict(world_size=2, dp=2, tp=1, pp=1, micro_batches=3), r"micro_batches=3 does not divide batch_size/dp=16"),
])
def test_bad_layouts_are_clear_errors(options, message):
    world = options.pop("world_size")
    with pytest.raises(ValueError, match=message):
        mpkit.train("3d", world, model="gpt", **options)
