"""The cost-graded exercises' references and measuring helpers, checked against PyTorch's and
mpkit's own mechanisms without launching a world (the checks themselves run in test_exercises.py
and tests/exercise_attempts/), and their stubs, untouched, reported as not done (one launch each):

* the loss scaler's reference scales are torch.amp.GradScaler's, step for step;
* the ZB-H1 reference reaches lab 04's (p-1)/(3m+p-1) with at most 1F1B's peak of activations,
  below 1F1B's bubble and mpkit's own zero-bubble lists; the interleaved reference is mpkit's
  ``schedule("interleaved", p, m, 2)``, which meets lab 04's (p-1)/(v·m) exactly;
* ``traffic`` gives a collective's bytes per rank as lab 05 states them; ``held`` sees tensors
  saved for backward and kept on a context, and not a storage freed by resizing it to zero;
* every assignment notebook's solution cell needs no name its setup cell does not import.
"""
import builtins
import symtable
from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch

from mpkit import exercises
from mpkit.exercises import EXERCISES, solutions
from mpkit.exercises.assignment import SETUP, solution_cell_source
from mpkit.exercises.held import Held
from mpkit.exercises.loss_scaling import reference_scales
from mpkit.exercises.pipeline_bubble import interleaved_placement
from mpkit.exercises.traffic import sent_bytes
from mpkit.parallel.pipeline.schedules import schedule, simulate


def _grad_scaler_scales(overflow_steps, steps, **options):
    """The scale after each update of torch.amp.GradScaler, with inf written into a gradient at
    ``overflow_steps`` (what every rank agreed on)."""
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([param], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", growth_factor=2.0, backoff_factor=0.5, **options)
    out = []
    for step in range(steps):
        opt.zero_grad()
        scaler.scale((param * 2).sum()).backward()
        if step in overflow_steps:
            param.grad[0] = float("inf")
        scaler.step(opt)
        scaler.update()
        out.append(scaler.get_scale())
    return out


@pytest.mark.parametrize("case", EXERCISES["loss_scaler"].cases, ids=lambda c: c.name("en"))
def test_reference_scales_are_torch_grad_scalers(case):
    overflows = {step for step, _, _ in case.params["overflow"]}
    options = {k: case.params[k] for k in ("init_scale", "growth_interval") if k in case.params}
    steps = case.params["steps"]
    assert reference_scales(overflows, steps, **options) == _grad_scaler_scales(overflows, steps, **options)


def test_reference_scales_follow_grad_scaler_on_a_long_irregular_run():
    overflows = {0, 1, 5, 6, 9, 17, 18, 19, 26}
    options = {"init_scale": 64.0, "growth_interval": 3}
    assert reference_scales(overflows, 30, **options) == _grad_scaler_scales(overflows, 30, **options)


SIZES = [(p, m) for p in (2, 3, 4, 5) for m in range(p, 2 * p + 2)]


@pytest.mark.parametrize("p, m", SIZES)
def test_zb_h1_reference_reaches_lab_04s_figure_within_1f1bs_activations(p, m):
    lists = [solutions.zb_h1_schedule(rank, p, m) for rank in range(p)]
    sim = simulate(lists, forward=1, backward=2, weight=1)     # F = B = W = 1 slot, as lab 04 §8
    assert sim.bubble == Fraction(p - 1, 3 * m + p - 1)       # (p-1)(F+B-W) idle slots per rank
    assert max(sim.peak_in_flight) <= min(m, p)                # 1F1B's peak (its rank 0)
    assert sim.bubble < simulate(schedule("1f1b", p, m)).bubble
    mpkit_zb = simulate(schedule("interleaved_zb", p, m, 1), forward=1, backward=2, weight=1)
    assert mpkit_zb.bubble >= sim.bubble                      # lab 04: mpkit's simple rule is a little above


@pytest.mark.parametrize("p, m", [(2, 2), (2, 4), (3, 6), (4, 4), (4, 8), (3, 9)])
def test_interleaved_reference_is_mpkits_schedule_and_meets_the_formula(p, m):
    lists = [solutions.interleaved_schedule(rank, p, m) for rank in range(p)]
    assert lists == schedule("interleaved", p, m, 2)
    sim = simulate(lists)
    assert sim.bubble / (1 - sim.bubble) == Fraction(p - 1, 2 * m)
    assert interleaved_placement(p) == [s % p for s in range(2 * p)]


def _call(kind, numel, peer=None):
    return SimpleNamespace(kind=kind, nbytes=4 * numel, peer=peer)


def test_traffic_gives_lab_05s_bytes_per_rank():
    n, s = 4, 4 * 100   # 4 ranks, a 100-element fp32 tensor
    assert sent_bytes(_call("all_reduce", 100), n, 0) == 2 * (n - 1) * s // n
    assert sent_bytes(_call("all_gather_into_tensor", 100), n, 1) == (n - 1) * s // n    # the output: S
    assert sent_bytes(_call("all_gather", 25), n, 1) == (n - 1) * s // n                 # one piece of N
    assert sent_bytes(_call("reduce_scatter_tensor", 25), n, 2) == (n - 1) * s // n      # the output: S/N
    assert sent_bytes(_call("send", 7), n, 0) == 28 and sent_bytes(_call("recv", 7), n, 0) == 0
    chain = [sent_bytes(_call("broadcast", 100, peer=2), n, r) for r in range(n)]
    assert chain == [s, 0, s, s]       # the chain's last rank (root - 1) forwards nothing
    assert sum(sent_bytes(_call("broadcast", 25, peer=root), n, r) for root in range(n) for r in range(n)) \
        == n * sent_bytes(_call("all_gather", 25), n, 0)   # N broadcasts of a piece move an all-gather's bytes


def test_held_sees_saved_and_kept_tensors_but_not_a_storage_resized_to_zero():
    class Keeps(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.kept = w.repeat(4)            # 400 floats on the context
            freed = w.repeat(2)               # 200 floats saved, then freed as FSDP2 does
            ctx.save_for_backward(x, freed)
            freed.untyped_storage().resize_(0)
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2, None

    x, w = torch.randn(3, requires_grad=True), torch.randn(100)
    with Held() as held:
        out = Keeps.apply(x, w).tanh()
    found = sorted(held.storages(out, before=[x, w]).values())
    assert found == [0, 12, 1600]     # the freed storage, tanh's saved output, the kept repeat


def _free_names(source: str) -> set:
    table = symtable.symtable(source, "<cell>", "exec")
    names, todo = set(), [table]
    while todo:
        scope = todo.pop()
        names |= {s.get_name() for s in scope.get_symbols() if s.is_global() and not s.is_assigned()}
        todo += scope.get_children()
    defined = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    return names - defined - set(dir(builtins))


def test_assignment_solution_cells_need_only_the_setup_imports():
    setup = {}
    exec(SETUP, setup)
    missing = {name: sorted(_free_names(solution_cell_source(ex)) - set(setup))
               for name, ex in EXERCISES.items()}
    assert {name: names for name, names in missing.items() if names} == {}


COST_GRADED = ["zb_h1_schedule", "interleaved_schedule", "halving_doubling_all_reduce", "fsdp_unit",
               "accumulate_gradients", "loss_scaler", "checkpoint_block"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", COST_GRADED)
def test_untouched_stub_is_not_done(name, tmp_path):
    namespace = {}
    exec("import torch\n" + EXERCISES[name].stub, namespace)
    result = exercises.check(name, namespace[EXERCISES[name].target], lang="ko", results_dir=tmp_path)
    assert result.not_done and not result.passed and "아직 풀지 않았습니다" in result.message
    assert not list(tmp_path.glob("*.json"))
