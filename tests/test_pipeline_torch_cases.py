"""PyTorch's own pipelining test cases (``test/distributed/pipelining/test_schedule_multiproc.py``:
``test_multi_iter``, ``test_grad_with_tracer``, ``test_grad_with_manual``,
``test_grad_with_manual_interleaved``, ``test_schedule_with_native_zero_bubble``,
``test_non_symmetric_stage_ids``) run against ``mpkit.parallel.pipeline`` through a thin adapter
with torch's names (``PipelineStage``, ``ScheduleGPipe``, ..., ``schedule.step(x, target=...,
losses=[])``), on gloo with smaller sizes (d_hid 16, batch 32) so 2-4 CPU ranks run them in seconds.

Each case checks what torch's checks: the last stage's output and the sum of the micro-batch
losses against a plain run of the whole model, and every rank's gradients against it
(rtol 1e-5, atol 4e-5: torch's own tolerances). Each also runs the same case with torch's own
schedule class and asserts that its gradients equal ours (the cross-check of each schedule).
``ScheduleDualPipeV``'s case runs in ``tests/test_pp_dualpipev.py`` through this adapter. Not ported: the forward-only schedule, the
custom-runtime CSV cases and ``dw_builder`` (torch-internal APIs without an mpkit counterpart).
"""
import copy

import pytest
import torch
import torch.distributed.pipelining as torch_pp
from torch import nn

import mpkit

D_HID, BATCH = 16, 32
RTOL, ATOL = 1e-5, 4e-5  # test_schedule_multiproc.py's


# ---- the adapter: torch's names over mpkit.parallel.pipeline -----------------------------------

class PipelineStage:
    """torch's ``PipelineStage(submodule, stage_index, num_stages, device)``: one stage of this rank."""

    def __init__(self, submodule, stage_index, num_stages, device, **_shape_args):
        self.submod, self.stage_index, self.num_stages = submodule.to(device), stage_index, num_stages


def schedule_class(name):
    """A torch-like schedule class running mpkit's ``name`` schedule on this rank's stages."""
    class Schedule:
        def __init__(self, stages, n_microbatches, loss_fn=None, scale_grads=True, stage_index_to_group_rank=None):
            from mpkit.parallel import pipeline
            stages = stages if isinstance(stages, list) else [stages]
            self.pipe = pipeline({s.stage_index: s.submod for s in stages}, num_stages=stages[0].num_stages,
                                 schedule=name, micro_batches=n_microbatches, loss_fn=loss_fn,
                                 virtual_stages=len(stages), scale_grads=scale_grads)

        def step(self, *args, target=None, losses=None):
            outputs = []
            self.pipe.step(args[0] if args else None, target, losses=losses, outputs=outputs)
            return torch.cat(outputs) if outputs else None
    Schedule.__name__ = f"mpkit[{name}]"
    return Schedule


OURS = {"ScheduleGPipe": schedule_class("gpipe"), "Schedule1F1B": schedule_class("1f1b"),
        "ScheduleInterleaved1F1B": schedule_class("interleaved"), "ScheduleLoopedBFS": schedule_class("looped_bfs"),
        "ScheduleInterleavedZeroBubble": schedule_class("interleaved_zb"),
        "ScheduleZBVZeroBubble": schedule_class("zbv"), "ScheduleDualPipeV": schedule_class("dualpipev")}


# ---- torch's model_registry.MultiMLP, as its tests build it -----------------------------------

class MLPModule(nn.Module):
    def __init__(self, d_hid):
        super().__init__()
        self.net1, self.relu, self.net2 = nn.Linear(d_hid, d_hid), nn.ReLU(), nn.Linear(d_hid, d_hid)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


class MultiMLP(nn.Module):
    def __init__(self, d_hid, n_layers=2):
        super().__init__()
        self.layers = nn.ModuleList([MLPModule(d_hid) for _ in range(n_layers)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def data(ref_mod):
    torch.manual_seed(1)
    x = torch.randn(BATCH, D_HID)
    with torch.no_grad():
        target = ref_mod(x) + torch.randn(BATCH, D_HID)  # "add a small perturbation"
    return x, target


# ---- one rank of a case ------------------------------------------------------------------------

def _case(ctx, schedule_name, rank_stages, m, steps, zero_grad, whole_model, ours):
    """torch's test body: the reference, then the schedule on this rank's stages; returns what
    the assertions need (as max differences, so the caller asserts)."""
    n_stages = sum(len(v) for v in rank_stages.values())
    torch.manual_seed(0)
    full_mod = MultiMLP(D_HID, n_layers=n_stages)
    ref_mod = copy.deepcopy(full_mod)
    x, target = data(ref_mod)
    loss_fn = nn.MSELoss(reduction="sum")
    for _ in range(steps):  # the reference: gradients of the whole model (accumulated if no zero_grad)
        if zero_grad:
            ref_mod.zero_grad()
        ref_out = ref_mod(x)
        ref_loss = loss_fn(ref_out, target)
        ref_loss.backward()
    mine = rank_stages[ctx.rank]
    names = [f"layers.{i}" for i in mine]
    modules = [full_mod.get_submodule(n) for n in names]
    first, last = 0 in mine, n_stages - 1 in mine
    if ours:
        cls = OURS[schedule_name]
        if whole_model:  # test_grad_with_tracer: every rank has the whole model, pipeline() cuts it
            from mpkit.parallel import pipeline
            pipe = pipeline(nn.Sequential(*full_mod.layers), split_points=list(range(1, n_stages)),
                            schedule=schedule_name_of(cls), micro_batches=m, loss_fn=loss_fn, scale_grads=False)
            schedule = cls.__new__(cls)
            schedule.pipe = pipe
        else:
            schedule = cls([PipelineStage(mod, i, n_stages, ctx.device) for mod, i in zip(modules, mine)], m,
                           loss_fn=loss_fn, scale_grads=False)  # a sum loss: no division by m
    else:
        cls = getattr(torch_pp, schedule_name)
        stages = [torch_pp.PipelineStage(mod, i, n_stages, ctx.device) for mod, i in zip(modules, mine)]
        single = schedule_name in ("ScheduleGPipe", "Schedule1F1B")  # torch's take one stage, the others a list
        schedule = cls(stages[0] if single else stages, m, loss_fn=loss_fn, scale_grads=False)
    out, losses = None, []  # one list for every step, as torch's tests build it: each step clears and refills it
    for _ in range(steps):
        if zero_grad:
            for mod in modules:
                mod.zero_grad()
        if first and last:
            out = schedule.step(x, target=target, losses=losses)
        elif first:
            schedule.step(x)
        elif last:
            out = schedule.step(target=target, losses=losses)
        else:
            schedule.step()
    result = {"grads": {f"{n}.{k}": p.grad.clone() for n, mod in zip(names, modules)
                        for k, p in mod.named_parameters()}}
    bad = []
    for n, mod in zip(names, modules):
        for k, p in mod.named_parameters():
            ref = ref_mod.get_submodule(n).get_parameter(k).grad
            if not torch.allclose(p.grad, ref, rtol=RTOL, atol=ATOL):
                bad.append(f"{n}.{k}: {(p.grad - ref).abs().max().item():.2e}")
    result["bad_grads"] = bad
    if last:
        result["out_ok"] = torch.allclose(out, ref_out, rtol=1.3e-6, atol=1e-5)
        result["loss_diff"] = abs(sum(losses).item() - ref_loss.item()) / ref_loss.item()
        result["n_losses"] = len(losses)
    return result


def schedule_name_of(cls):
    return cls.__name__[len("mpkit["):-1]


def run_case(world_size, schedule_name, rank_stages, m, steps=2, zero_grad=True, whole_model=False):
    ours = mpkit.launch(_case, world_size, timeout=90, memory=False,
                        args=(schedule_name, rank_stages, m, steps, zero_grad, whole_model, True))
    for r, res in enumerate(ours):
        assert res["bad_grads"] == [], f"rank {r}: gradients differ from the reference: {res['bad_grads']}"
        if "out_ok" in res:
            assert res["out_ok"] and res["n_losses"] == m
            assert res["loss_diff"] < 1.3e-6 * 10  # sum of m float32 sums against one: a few ulps
    theirs = mpkit.launch(_case, world_size, timeout=90, memory=False,
                          args=(schedule_name, rank_stages, m, steps, zero_grad, False, False))
    for r, (a, b) in enumerate(zip(ours, theirs)):
        assert a["grads"].keys() == b["grads"].keys()
        for k in a["grads"]:  # ours against torch's own schedule: the same gradients
            assert torch.allclose(a["grads"][k], b["grads"][k], rtol=RTOL, atol=ATOL), (r, k)


def round_robin(p, per_rank):
    return {r: [r + i * p for i in range(per_rank)] for r in range(p)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("schedule_name", ["ScheduleGPipe", "Schedule1F1B"])
def test_grad_with_manual(world_size, schedule_name):
    run_case(world_size, schedule_name, round_robin(world_size, 1), m=4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule_name", ["ScheduleGPipe", "Schedule1F1B"])
def test_grad_with_tracer(schedule_name):
    # torch builds the stages from the whole model with its tracer; ours cuts the nn.Sequential
    run_case(2, schedule_name, round_robin(2, 1), m=4, whole_model=True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule_name", ["ScheduleGPipe", "Schedule1F1B"])
def test_multi_iter(schedule_name):
    run_case(2, schedule_name, round_robin(2, 1), m=4, steps=4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("schedule_name", ["ScheduleInterleaved1F1B", "ScheduleLoopedBFS",
                                           "ScheduleInterleavedZeroBubble"])
def test_grad_with_manual_interleaved(world_size, schedule_name):
    run_case(world_size, schedule_name, round_robin(world_size, 2), m=8)


@pytest.mark.timeout(120)
def test_schedule_with_native_zero_bubble():
    # 4 steps without zero_grad: gradients accumulate over steps, in the reference too
    run_case(2, "ScheduleInterleavedZeroBubble", {0: [0, 2], 1: [1, 3]}, m=8, steps=4, zero_grad=False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("m", [1, 4])
def test_non_symmetric_stage_ids(m):
    # ZB-V: rank 0 holds the first and the last stage, rank 1 the middle two (the V's turn)
    run_case(2, "ScheduleZBVZeroBubble", {0: [0, 3], 1: [1, 2]}, m=m)
