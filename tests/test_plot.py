"""mpkit.plot on hand-built traces and memory reports with known content, then on real runs."""
import io
import warnings
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.font_manager import FontProperties, findfont
from matplotlib.patches import Rectangle
from matplotlib.colors import to_hex

import mpkit
from mpkit import plot
from mpkit.observe.memory import CATEGORIES, MemoryReport
from mpkit.observe.trace import Event, Trace
from mpkit import i18n
from mpkit.plot import fonts
from mpkit.plot.comm import unit_for
from mpkit.simulator.formulas import wire_factor
from mpkit.plot.style import CATEGORY_COLOURS, KIND_COLOURS
from mpkit.plot.timeline import COMM_LANE, COMPUTE_LANE

MS = 1e-3
MIB = 2**20


# ---------- hand-built inputs ----------

def gpipe_trace(step=0, offset=0.0):
    """GPipe, 2 stages x 2 micro-batches, 1 ms per forward/backward, 0.25 ms per send.

    Window 6 ms, 4 ms compute per rank -> bubble 1/3 = (p-1)/(m+p-1); comm 0.5 ms per rank -> 1/12.
    """
    def ev(rank, kind, start, end, mb=None, nbytes=0):
        return Event(rank, kind, (offset + start) * MS, (offset + end) * MS, stage=rank, micro_batch=mb,
                     bytes=nbytes, step=step)
    return [
        ev(0, "forward", 0, 1, 0), ev(0, "send", 1, 1.25, 0, 4096), ev(0, "forward", 1, 2, 1),
        ev(0, "send", 2, 2.25, 1, 4096), ev(0, "backward", 4, 5, 1), ev(0, "backward", 5, 6, 0),
        ev(1, "forward", 1, 2, 0), ev(1, "forward", 2, 3, 1), ev(1, "backward", 3, 4, 1),
        ev(1, "send", 4, 4.25, 1, 4096), ev(1, "backward", 4, 5, 0), ev(1, "send", 5, 5.25, 0, 4096),
    ]


@pytest.fixture
def trace():
    return Trace(events=gpipe_trace(), enabled=False)


def patches(ax, gid):
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_gid() == gid]


def spans(ax, gid):
    return sorted((round(p.get_x(), 9), round(p.get_width(), 9), round(p.get_y(), 9)) for p in patches(ax, gid))


def report(rank, by_category, peak_total=None, capacity=None, samples=None, peak=None):
    values = {c: int(by_category.get(c, 0)) for c in CATEGORIES}
    return MemoryReport(rank, capacity, peak_total if peak_total is not None else sum(values.values()),
                        peak or values, values, samples or [(0.0, tuple(values.values()))])


def png_bytes(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


# ---------- fonts and labels ----------

def test_korean_text_renders_with_a_hangul_font_and_no_missing_glyphs(trace):
    family = fonts.hangul_family()
    assert family is not None
    path = findfont(FontProperties(family=family), fallback_to_default=False)
    assert "Nanum" in path or "Noto" in path
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = plot.timeline(trace, lang="ko", title="파이프라인 버블: 한글 제목")
        data = png_bytes(fig)
    assert data.startswith(b"\x89PNG")
    assert not [w for w in caught if "Glyph" in str(w.message)], [str(w.message) for w in caught]
    assert fig.axes[0].title.get_fontfamily()[0] == family


def test_global_rcparams_are_left_alone(trace):
    before = list(matplotlib.rcParams["font.family"])
    plot.timeline(trace, lang="ko")
    assert matplotlib.rcParams["font.family"] == before


def test_missing_hangul_font_warns_once_with_the_install_command(monkeypatch):
    monkeypatch.setattr(fonts, "_candidates", lambda: [])
    fonts.hangul_family.cache_clear()
    try:
        with pytest.warns(UserWarning, match="pip install koreanize-matplotlib"):
            assert fonts.hangul_family() is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert fonts.rc() == {"font.family": ["DejaVu Sans"]}
    finally:
        fonts.hangul_family.cache_clear()


def test_every_label_has_both_languages():
    for key, pair in i18n.STRINGS.items():
        assert set(pair) == set(i18n.LANGS) and all(pair.values()), key


@pytest.mark.parametrize("draw", [
    lambda t, r, lang: plot.timeline(t, lang=lang),
    lambda t, r, lang: plot.memory(r, lang=lang),
    lambda t, r, lang: plot.memory_over_time(r, lang=lang),
    lambda t, r, lang: plot.comm(r, lang=lang),
])
def test_unknown_lang_is_a_value_error(trace, draw):
    run = SimpleNamespace(trace=trace, memory=[report(0, {"parameters": MIB}), report(1, {"parameters": MIB})])
    with pytest.raises(ValueError, match="lang must be one of 'ko', 'en', got 'fr'"):
        draw(trace, run, "fr")


# ---------- timeline ----------

def test_timeline_one_row_per_rank_with_rank_0_on_top(trace):
    ax = plot.timeline(trace).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    assert list(ax.get_yticks()) == [0, 1]
    bottom, top = ax.get_ylim()
    assert top < bottom  # y grows downwards: rank 0 at the top


def test_timeline_draws_every_event_with_its_extent_lane_and_colour(trace):
    ax = plot.timeline(trace).axes[0]
    drawn = {(round(p.get_x(), 9), round(p.get_width(), 9), round(p.get_y(), 9)): p
             for gid in ("compute", "comm") for p in patches(ax, gid)}
    assert len(drawn) == len(trace.events)
    for e in trace.events:
        offset, height = COMPUTE_LANE if e.category == "compute" else COMM_LANE
        patch = drawn[(round(e.start * 1e3, 9), round(e.duration * 1e3, 9), round(e.rank + offset, 9))]
        assert patch.get_height() == height
        assert to_hex(patch.get_facecolor()) == KIND_COLOURS[e.kind].lower()
    assert COMM_LANE[1] < COMPUTE_LANE[1]  # the thinner sub-lane
    assert COMPUTE_LANE[0] + COMPUTE_LANE[1] <= COMM_LANE[0]  # below compute, not on top of it
    assert ax.get_xlim() == pytest.approx((0.0, 6.0))


def test_timeline_shades_exactly_the_compute_gaps_as_bubbles(trace):
    ax = plot.timeline(trace).axes[0]
    gaps = [(x, w, round(y - COMPUTE_LANE[0])) for x, w, y in spans(ax, "idle")]
    assert gaps == [(0.0, 1.0, 1), (2.0, 2.0, 0), (5.0, 1.0, 1)]
    assert all(p.get_hatch() for p in patches(ax, "idle"))
    shaded = sum(w for _, w, _ in gaps)
    assert shaded / (6.0 * 2) == pytest.approx(1 / 3)


def test_timeline_title_carries_bubble_and_comm_share(trace):
    title = plot.timeline(trace).axes[0].get_title(loc="left")
    # computed by hand: 1 - 8 ms compute / (6 ms x 2 ranks); 1 ms of sends / 12 rank-ms
    assert "bubble share 33.3%" in title and "comm share 8.3%" in title


def test_timeline_labels_spans_with_micro_batch_and_stage(trace):
    texts = {t.get_text() for t in plot.timeline(trace).axes[0].texts}
    assert {"F0 s0", "F1 s0", "B1 s0", "B0 s1"} <= texts


def test_timeline_step_keeps_one_optimizer_step():
    two_steps = Trace(events=gpipe_trace(step=0) + gpipe_trace(step=1, offset=10.0), enabled=False)
    ax = plot.timeline(two_steps, step=1).axes[0]
    xs = [x for x, _, _ in spans(ax, "compute")]
    assert len(xs) == 8 and min(xs) == pytest.approx(10.0)
    assert ax.get_xlim() == pytest.approx((10.0, 16.0))
    assert "step 1" in ax.get_title(loc="left")
    whole = plot.timeline(two_steps).axes[0]
    assert len(patches(whole, "compute")) == 16
    assert [t.get_text() for t in whole.texts if t.get_text().startswith("step")] == ["step 0", "step 1"]
    with pytest.raises(ValueError, match=r"pass one of \[0, 1\]"):
        plot.timeline(two_steps, step=5)


def test_timeline_overlays_a_prediction_as_outlines_aligned_to_the_start(trace):
    predicted = Trace(events=[Event(r, "forward", 100 * MS, 101.5 * MS) for r in (0, 1)]
                      + [Event(1, "all_reduce", 101.5 * MS, 102 * MS, bytes=10)], enabled=False)
    ax = plot.timeline(SimpleNamespace(trace=trace), ideal=predicted).axes[0]
    outlines = patches(ax, "ideal")
    assert len(outlines) == 3 and not any(p.get_fill() for p in outlines)
    assert sorted(round(v, 9) for p in outlines for v in (p.get_x(), p.get_width())) == [0, 0, 0.5, 1.5, 1.5, 1.5]
    assert "predicted" in [t.get_text() for t in ax.get_legend().get_texts()]
    # a one-step prediction (step 0) overlays any measured step, from that step's start
    two_steps = Trace(events=gpipe_trace(step=0) + gpipe_trace(step=1, offset=10.0), enabled=False)
    one_step = Trace(events=gpipe_trace(step=0, offset=50.0), enabled=False)
    zoomed = plot.timeline(two_steps, step=1, ideal=one_step).axes[0]
    measured = sorted(spans(zoomed, "compute") + spans(zoomed, "comm"))
    assert spans(zoomed, "ideal") == measured  # same schedule, so the outlines sit on the spans


def test_timeline_in_korean(trace):
    ax = plot.timeline(trace, lang="ko").axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["랭크 0", "랭크 1"]
    assert "버블 비율 33.3%" in ax.get_title(loc="left")
    assert ax.get_xlabel() == "시간 (ms)"
    assert {"순전파", "역전파", "송신", "유휴 (버블)"} <= {t.get_text() for t in ax.get_legend().get_texts()}


def test_timeline_draws_into_a_given_axes_and_rejects_what_is_not_a_trace(trace):
    from matplotlib.figure import Figure
    fig = Figure()
    ax = fig.subplots()
    assert plot.timeline(trace, ax=ax) is fig
    with pytest.raises(ValueError, match="pass a Run"):
        plot.timeline([1, 2, 3])
    with pytest.raises(ValueError, match="no events"):
        plot.timeline(Trace(enabled=False))


# ---------- memory ----------

def two_runs():
    dp = SimpleNamespace(strategy="dp", memory=[
        report(r, {"parameters": 4 * MIB, "gradients": 4 * MIB, "optimizer": 8 * MIB, "activations": 2 * MIB},
               peak_total=17 * MIB, capacity=24 * MIB) for r in (0, 1)])
    zero1 = SimpleNamespace(strategy="zero1", memory=[
        report(r, {"parameters": 4 * MIB, "gradients": 4 * MIB, "optimizer": 4 * MIB, "activations": 2 * MIB,
                   "other": MIB // 2}, capacity=24 * MIB) for r in (0, 1)])
    return dp, zero1


def bar_heights(ax, category):
    return [p.get_height() for p in patches(ax, category)]


def test_memory_stacks_categories_in_mib_per_rank_and_run():
    dp, zero1 = two_runs()
    ax = plot.memory({"DP": dp, "ZeRO-1": zero1}).axes[0]
    assert bar_heights(ax, "parameters") == [4, 4, 4, 4]
    assert bar_heights(ax, "optimizer") == [8, 8, 4, 4]
    assert bar_heights(ax, "other") == [0, 0, 0.5, 0.5]
    optimizer_bottoms = [p.get_y() for p in patches(ax, "optimizer")]
    assert optimizer_bottoms == [8, 8, 8, 8]  # on top of parameters + gradients
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "0", "1"]
    texts = [t.get_text() for t in ax.texts]
    assert "DP" in texts and "ZeRO-1" in texts
    assert [t for t in texts if t[0].isdigit()] == ["17", "17", "14.5", "14.5"]  # peak totals
    capacity = [c for c in ax.collections if c.get_gid() == "capacity"]
    assert len(capacity) == 2 and all(c.get_segments()[0][0][1] == 24 for c in capacity)
    assert to_hex(patches(ax, "activations")[0].get_facecolor()) == CATEGORY_COLOURS["activations"].lower()


def test_memory_of_one_run_kinds_labels_and_errors():
    dp, zero1 = two_runs()
    peak = report(0, {"parameters": MIB, "activations": 3 * MIB}, peak={**dict.fromkeys(CATEGORIES, 0),
                                                                       "parameters": MIB, "activations": MIB})
    ax = plot.memory([peak], kind="peak").axes[0]
    assert bar_heights(ax, "activations") == [1]
    assert bar_heights(plot.memory([peak]).axes[0], "activations") == [3]
    named = plot.memory([dp, zero1], labels=["a", "b"]).axes[0]
    assert {"a", "b"} <= {t.get_text() for t in named.texts}
    same = plot.memory([dp, dp]).axes[0]
    assert {"dp #0", "dp #1"} <= {t.get_text() for t in same.texts}
    with pytest.raises(ValueError, match="one per run"):
        plot.memory([dp, zero1], labels=["only one"])
    with pytest.raises(ValueError, match="kind="):
        plot.memory(dp, kind="average")
    with pytest.raises(ValueError, match="dict"):
        plot.memory(42)


def test_memory_in_korean():
    ax = plot.memory(two_runs()[0], lang="ko").axes[0]
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    assert {"파라미터", "그래디언트", "옵티마이저 상태", "활성값", "장치 용량"} <= legend
    assert ax.get_ylabel() == "메모리 (MiB)"


# ---------- memory over time ----------

def timed_run():
    """Rank 0 and 1: parameters from t=100 s, activations rise during forward of step 0, fall in backward."""
    t0 = 100.0
    def samples(extra):
        return [(t0 + 0.000, (MIB, 0, 0, 0, 0)), (t0 + 0.001, (MIB, 0, 0, extra, 0)),
                (t0 + 0.002, (MIB, MIB, 0, 0, 0)), (t0 + 0.0035, (MIB, MIB, 2 * MIB, 0, 0))]
    events = [Event(r, kind, s * MS, e * MS, step=0) for r in (0, 1)
              for kind, s, e in (("forward", 0, 1), ("backward", 1, 2), ("optimizer", 2, 3))]
    trace = Trace(events=events, enabled=False, t0=t0)
    return SimpleNamespace(strategy="dp", trace=trace,
                           memory=[report(0, {}, samples=samples(MIB)), report(1, {}, samples=samples(3 * MIB))])


def test_memory_over_time_is_on_the_trace_clock():
    fig = plot.memory_over_time(timed_run())
    assert len(fig.axes) == 2
    ax = fig.axes[1]
    total = next(line for line in ax.get_lines() if line.get_gid() == "total")
    assert list(total.get_xdata()) == pytest.approx([0.0, 1.0, 2.0, 3.5, 3.5])
    assert list(total.get_ydata()) == pytest.approx([1, 4, 2, 4, 4])
    assert ax.get_xlim() == pytest.approx((0.0, 3.5))
    assert ax.get_ylabel().startswith("rank 1")
    strip = sorted((round(p.get_x(), 9), round(p.get_width(), 9)) for p in patches(ax, "strip"))
    assert strip == [(0, 1), (1, 1), (2, 1)]


def test_memory_over_time_ranks_and_step():
    run = timed_run()
    fig = plot.memory_over_time(run, ranks=[1], step=0, lang="ko")
    assert len(fig.axes) == 1 and fig.axes[0].get_ylabel().startswith("랭크 1")
    assert fig.axes[0].get_xlim() == pytest.approx((0.0, 3.0))
    total = next(line for line in fig.axes[0].get_lines() if line.get_gid() == "total")
    assert list(total.get_xdata()) == pytest.approx([0.0, 1.0, 2.0, 3.0])  # the 3.5 ms sample is outside
    with pytest.raises(ValueError, match=r"ranks=\[7\]"):
        plot.memory_over_time(run, ranks=[7])
    with pytest.raises(ValueError, match="step=3"):
        plot.memory_over_time(run, step=3)


# ---------- comm ----------

def comm_trace(n=4, payload=MIB):
    events = [Event(r, "all_reduce", 0.0, 1 * MS, bytes=payload) for r in range(n)]
    events += [Event(r, "reduce_scatter", 1 * MS, 2 * MS, bytes=payload) for r in range(n)]
    events += [Event(0, "send", 2 * MS, 3 * MS, bytes=payload // 4), Event(1, "recv", 2 * MS, 3 * MS)]
    return SimpleNamespace(strategy="fsdp", world_size=n, trace=Trace(events=events, enabled=False))


def test_comm_bars_are_ring_formula_for_collectives_and_measured_for_p2p():
    ax = plot.comm(comm_trace()).axes[0]
    assert [p.get_height() for p in patches(ax, "all_reduce")] == pytest.approx([1.5] * 4)  # 2(N-1)/N MiB
    assert [p.get_height() for p in patches(ax, "reduce_scatter")] == pytest.approx([0.75] * 4)  # (N-1)/N
    assert [p.get_height() for p in patches(ax, "send")] == pytest.approx([0.25, 0, 0, 0])
    assert patches(ax, "all_reduce")[0].get_hatch() and not patches(ax, "send")[0].get_hatch()
    assert {"hatched: ring formula", "solid: measured"} <= {t.get_text() for t in ax.get_legend().get_texts()}
    assert patches(ax, "recv") == []  # a receive puts nothing on this rank's wire
    assert ax.get_ylabel() == "bytes sent (MiB)"
    note = next(t for t in ax.texts if t.get_gid() == "note").get_text()
    assert "2(N-1)/N·S" in note and "N = 4" in note and "measured" in note
    assert wire_factor("all_gather", 8) == 7 / 8


def test_hand_written_ring_all_reduce_measures_the_formula():
    n, payload = 4, 4 * MIB
    chunk = payload // n  # reduce-scatter then all-gather: 2(N-1) sends of S/N per rank
    events = [Event(r, "send", i * MS, (i + 0.5) * MS, bytes=chunk, name="ring") for r in range(n)
              for i in range(2 * (n - 1))]
    run = SimpleNamespace(world_size=n, trace=Trace(events=events, enabled=False))
    ax = plot.comm(run, all_reduce_payload=payload).axes[0]
    reference = next(line for line in ax.get_lines() if line.get_gid() == "reference").get_ydata()[0]
    assert reference == pytest.approx(6.0)  # 2*3/4 * 4 MiB
    assert [p.get_height() for p in patches(ax, "send")] == pytest.approx([reference] * n)
    assert "hatched: ring formula" not in {t.get_text() for t in ax.get_legend().get_texts()}
    with pytest.raises(ValueError, match="payload size S in bytes"):
        plot.comm(run, all_reduce_payload="big")


def test_comm_in_korean_and_without_communication():
    ax = plot.comm(comm_trace(), lang="ko").axes[0]
    assert {"all-reduce", "reduce-scatter", "송신"} <= {t.get_text() for t in ax.get_legend().get_texts()}
    assert ax.get_ylabel() == "보낸 바이트 (MiB)"
    quiet = SimpleNamespace(world_size=1, trace=Trace(events=[Event(0, "forward", 0, 1)], enabled=False))
    assert "no communication in this run" in [t.get_text() for t in plot.comm(quiet).axes[0].texts]


# ---------- save ----------

def test_save_writes_a_png(trace, tmp_path):
    path = plot.save(plot.timeline(trace), tmp_path / "sub" / "timeline.png")
    data = open(path, "rb").read()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000


# ---------- real runs ----------

@pytest.fixture(scope="module")
def single_run():
    return mpkit.train("single", steps=2)


def test_real_single_run(single_run, tmp_path):
    run = single_run
    ax = plot.timeline(run).axes[0]
    assert len(ax.get_yticks()) == 1 and len(patches(ax, "compute")) == len(run.trace.events) == 6
    assert f"bubble share {run.trace.bubble_share():.1%}" in ax.get_title(loc="left")
    bars = plot.memory(run).axes[0]
    for category in CATEGORIES:
        assert bar_heights(bars, category) == pytest.approx([run.memory_by_category()[0][category] / MIB])
    curves = plot.memory_over_time(run, step=1).axes[0]
    start, end = run.trace.filter(step=1).window()
    assert curves.get_xlim() == pytest.approx((start * 1e3, end * 1e3))
    total = next(line for line in curves.get_lines() if line.get_gid() == "total")
    assert max(total.get_ydata()) <= run.memory[0].peak_total / MIB + 1e-9
    assert "no communication in this run" in [t.get_text() for t in plot.comm(run).axes[0].texts]
    assert plot.save(plot.timeline(run, lang="ko"), tmp_path / "single.png")


@pytest.mark.timeout(240)
def test_real_dp_zero1_and_pipeline_runs(single_run):
    dp = mpkit.train("dp", world_size=4, steps=2)
    zero1 = mpkit.train("zero1", world_size=4, steps=2)
    pipe = mpkit.train("pp", world_size=4, steps=2, schedule="1f1b", micro_batches=8)

    ax = plot.timeline(pipe, step=1).axes[0]
    assert len(ax.get_yticks()) == 4
    forwards = [p for p in patches(ax, "compute") if to_hex(p.get_facecolor()) == KIND_COLOURS["forward"].lower()]
    assert len(forwards) == 4 * 8  # every micro-batch on every stage
    assert f"bubble share {pipe.trace.filter(step=1).bubble_share():.1%}" in ax.get_title(loc="left")

    bars = plot.memory({"single": single_run, "dp": dp, "zero1": zero1}).axes[0]
    optimizer = bar_heights(bars, "optimizer")
    assert len(optimizer) == 1 + 4 + 4
    assert all(z < d for d, z in zip(optimizer[1:5], optimizer[5:]))  # ZeRO-1 shards optimizer state

    wire = plot.comm(dp).axes[0]
    payload = dp.trace.bytes_by_kind()[0]["all_reduce"]
    unit, size = unit_for(max(b * wire_factor(k, 4) for r in dp.trace.bytes_by_kind().values() for k, b in r.items()))
    assert wire.get_ylabel() == f"bytes sent ({unit})"
    assert patches(wire, "all_reduce")[0].get_height() * size == pytest.approx(payload * 2 * 3 / 4)


NOTEBOOK_CELLS = [  # (source, images the notebook must show for it)
    ("%matplotlib inline\nimport matplotlib.pyplot as plt\nimport mpkit\n"
     "p = mpkit.sim.predict('pp', hardware='8xA100-nvlink')", 0),
    ("mpkit.plot.timeline(p)\nplt.show()", 1),                       # lab 11's cells showed nothing
    ("mpkit.plot.timeline(p); mpkit.plot.memory(p)", 2),             # README's line: the first was lost
    ("x = mpkit.plot.timeline(p)\n1", 1),                            # not the cell's value: shown when it ends
    ("fig = mpkit.plot.memory(p)\nfig", 1),                          # the cell's value: shown once, not twice
    ("from IPython.display import display\nfor f in (mpkit.plot.timeline(p), mpkit.plot.memory(p)):\n"
     "    display(f)", 2),                                           # as the what-if widget shows them
]


@pytest.mark.timeout(180)
def test_a_notebook_shows_every_figure_once_wherever_it_is_made(tmp_path):
    """Plot functions return figures a notebook shows once, whether the cell ends with them, calls
    plt.show() or neither (issue 46: lab 11's timelines never showed)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source, _ in NOTEBOOK_CELLS])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    images = [sum("image/png" in out.get("data", {}) for out in cell.outputs) for cell in nb.cells]
    assert images == [count for _, count in NOTEBOOK_CELLS]


def test_outside_a_notebook_plots_leave_no_pyplot_figures_open(trace):
    import matplotlib.pyplot as plt

    assert matplotlib.get_backend().lower() == "agg"
    fig = plot.timeline(trace)
    assert plt.get_fignums() == [] and type(fig) is matplotlib.figure.Figure
