"""Lab 06 exercise: an FSDP / ZeRO-3 unit, a Linear layer whose parameters live sharded.

Each rank keeps one shard of the unit's flat parameters (W flattened, then b, zero-padded to N
equal shards). The learner's autograd Function all-gathers the shards before the forward, drops
the full parameters after it, all-gathers again in the backward and reduce-scatters the flat
gradient (averaged over the ranks, which trained on different rows) so each rank gets its shard's
gradient. A two-unit model trains two SGD steps on the ranks' rows of one batch.

Checked, in this order: every rank's shard gradients and shards equal the unsharded model's
(trained on the whole batch); nothing as large as an unsharded weight is held between forward and
backward (``held``: saved tensors, the Function's context); the bytes each rank sends equal one
all-gather per unit in the forward and an all-gather plus a reduce-scatter per unit in the
backward, (N-1)/N·S each on the ring (``traffic``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mpkit.exercises import harness
from mpkit.exercises.common import Case, Exercise, factor_hint, failed, mismatch, passed, ratio, seeded, close
from mpkit.exercises.held import Held
from mpkit.exercises.result import Text
from mpkit.exercises.traffic import sent

SIZES = (16, 16, 10)   # two units: 16 -> 16 (272 parameters) and 16 -> 10 (170), uneven over 3 and 4 ranks
ROWS, LR, STEPS = 12, 0.1, 2


@dataclass(frozen=True)
class Unit:
    """What an FSDP unit knows besides its shard: W's shape (out, in), the number of parameters
    before padding (out·in + out) and the world."""
    shape: tuple
    numel: int
    world_size: int
    rank: int


def _full_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(SIZES[0], SIZES[1]), torch.nn.Tanh(), torch.nn.Linear(SIZES[1], SIZES[2]))


def _linears(model):
    return [m for m in model if isinstance(m, torch.nn.Linear)]


def _flat(linear, grad=False):
    w, b = (linear.weight.grad, linear.bias.grad) if grad else (linear.weight, linear.bias)
    return torch.cat([w.detach().reshape(-1), b.detach()])


def _shards(flat, n):
    size = -(-flat.numel() // n)
    padded = torch.zeros(n * size)
    padded[:flat.numel()] = flat
    return list(padded.split(size))


def _batch(seed, step):
    g = seeded(seed + step)
    return torch.randn(ROWS, SIZES[0], generator=g), torch.randn(ROWS, SIZES[-1], generator=g)


def _reference(seed, n):
    """Per step: each unit's shard gradients (averaged: the whole batch's), then the shards after
    the step; ``"transposed"``: the gradients with W's laid out transposed (for the hint)."""
    model = _full_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = []
    for step in range(STEPS):
        x, y = _batch(seed, step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        grads = [_shards(_flat(lin, grad=True), n) for lin in _linears(model)]
        transposed = [_shards(torch.cat([lin.weight.grad.t().reshape(-1), lin.bias.grad]), n) for lin in _linears(model)]
        opt.step()
        out.append({"grads": grads, "transposed": transposed, "shards": [_shards(_flat(lin), n) for lin in _linears(model)]})
    return out


class _Sharded(torch.nn.Module):
    def __init__(self, fn, shard, unit):
        super().__init__()
        self.fn, self.unit, self.shard = fn, unit, torch.nn.Parameter(shard.clone())

    def forward(self, x):
        return self.fn.apply(x, self.shard, self.unit)


def _body(ctx, recorder, fn, seed):
    n, r = ctx.world_size, ctx.rank
    full = _linears(_full_model(seed))
    units = [_Sharded(fn, _shards(_flat(lin), n)[r], Unit(tuple(lin.weight.shape), _flat(lin).numel(), n, r))
             for lin in full]
    model = torch.nn.Sequential(units[0], torch.nn.Tanh(), units[1])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    rows = slice(r * ROWS // n, (r + 1) * ROWS // n)
    steps, held = [], {}
    for step in range(STEPS):
        x, y = (t[rows] for t in _batch(seed, step))
        opt.zero_grad()
        recorder.phase = f"forward {step}"
        with Held() as watch:
            out = recorder.call(model, x)
        if step == 0:
            held = watch.storages(out, owners=units, before=[x, *(u.shard for u in units)])
        watch.release()
        loss = F.mse_loss(out, y)
        recorder.phase = f"backward {step}"
        recorder.call(loss.backward)
        steps.append({"grads": [None if u.shard.grad is None else u.shard.grad.clone() for u in units]})
        opt.step()
        steps[-1]["shards"] = [u.shard.detach().clone() for u in units]
    return {"steps": steps, "held": max(held.values(), default=0)}


SUMMED = Text("그래디언트를 reduce-scatter로 합하기만 하고 world_size로 나누지 않았습니다: 랭크마다 다른 행으로 학습했으니 평균이 "
              "배치 전체의 그래디언트입니다.", "the reduce-scatter summed the gradients and never divided by the world size: "
              "the ranks trained on different rows, so their average is the whole batch's gradient.")


TRANSPOSED = Text("W의 그래디언트가 전치(transpose)된 배치입니다: W는 (out, in) 모양이니 grad_W = grad_outᵀ·x이고, xᵀ·grad_out이 "
                  "아닙니다. 펼치기 전에 모양이 W.shape과 같은지 보세요.",
                  "W's gradient is laid out transposed: W has shape (out, in), so grad_W = grad_outᵀ·x, not xᵀ·grad_out. "
                  "Check that it has W's shape before you flatten it.")


def _values(case, outputs, expected, n):
    for step, want in enumerate(expected):
        for rank, output in enumerate(outputs):
            got = output["out"]["steps"][step]
            for u in range(len(want["grads"])):
                where = Text(f"{step + 1}번째 스텝, 랭크 {rank}, 유닛 {u}의", f"step {step + 1}, rank {rank}, unit {u}'s")
                have = got["grads"][u]
                if have is None:
                    return failed(case, where + Text("샤드 그래디언트가 None입니다.", "shard gradient is None."),
                                  Text("backward는 (grad_x, grad_shard, None)을 돌려줘야 합니다: 두 번째가 이 랭크 샤드의 그래디언트입니다.",
                                       "backward must return (grad_x, grad_shard, None): the second is the gradient of "
                                       "this rank's shard."))
                if not close(want["grads"][u][rank], have):
                    factor = ratio(want["grads"][u][rank], have)
                    hint = SUMMED if factor is not None and abs(factor - n) < 1e-3 * n else factor_hint(factor, n)
                    if hint is None and close(want["transposed"][u][rank], have):
                        hint = TRANSPOSED
                    return failed(case, mismatch(where + Text("샤드 그래디언트:", "shard gradient:"), want["grads"][u][rank], have),
                                  hint or Text("평평한(flat) 그래디언트는 W를 펼친 것 다음 b이고, 0으로 채워(padding) N개의 같은 "
                                               "샤드로 나눕니다: 랭크 r의 몫은 r번째 조각입니다.",
                                               "the flat gradient is W flattened, then b, zero-padded and cut into N "
                                               "equal shards: rank r's is piece r."))
                if not close(want["shards"][u][rank], got["shards"][u]):
                    return failed(case, mismatch(where + Text("샤드:", "shard:"), want["shards"][u][rank], got["shards"][u]),
                                  Text("샤드는 옵티마이저가 갱신합니다: forward가 shard를 바꾸거나 다른 텐서로 바꿔치지 않게 하세요.",
                                       "the optimizer updates the shard: the forward must not change or replace it."))
    return None


def _cost(case, outputs, n):
    units = _linears(_full_model(case.params["seed"]))
    shard_bytes = [4 * -(-_flat(lin).numel() // n) for lin in units]
    gather = sum((n - 1) * b for b in shard_bytes)   # each rank sends (N-1) shards per unit and all-gather
    weight = min(4 * lin.weight.numel() for lin in units)
    for rank, output in enumerate(outputs):
        held = output["out"]["held"]
        if held >= weight:
            return failed(case, Text(f"랭크 {rank}: 순전파와 역전파 사이에 {held} B짜리 텐서를 들고 있습니다. 목표: 가장 작은 전체(unsharded) "
                                     f"가중치({weight} B)보다 작은 것만 — 입력 x와 샤드.",
                                     f"rank {rank} holds a tensor of {held} B between forward and backward; target: "
                                     f"nothing as large as the smallest unsharded weight ({weight} B) — only x and the shard."),
                          Text("모은(all-gather) 전체 파라미터를 save_for_backward나 ctx에 두면 역전파까지 살아 있어 ZeRO-3의 메모리 이득이 "
                               "사라집니다: x와 shard만 저장하고, backward에서 다시 all-gather하세요.",
                               "keeping the gathered full parameters (save_for_backward or ctx) holds them until the "
                               "backward and loses ZeRO-3's memory saving: save only x and the shard, and all-gather "
                               "again in the backward."))
        for step in range(STEPS):
            for part, target in (("forward", gather), ("backward", 2 * gather)):
                measured = sent(output["calls"], n, rank, f"{part} {step}")
                if measured > target * (1 + 1e-9) or measured == 0:
                    return failed(case, Text(f"랭크 {rank}, {step + 1}번째 스텝의 {PARTS[part][0]}: {measured:.0f} B를 보냈습니다. "
                                             f"목표: {PARTS[part][1]} = {target} B((N-1)/N·S씩).",
                                             f"rank {rank}, step {step + 1}'s {part}: sent {measured:.0f} B; target: "
                                             f"{PARTS[part][2]} = {target} B ((N-1)/N·S each)."),
                                  NO_REGATHER if measured == 0 else GATHER if part == "forward" else SCATTER)
    return None


PARTS = {"forward": ("순전파", "유닛마다 all-gather 한 번", "one all-gather per unit"),
         "backward": ("역전파", "유닛마다 all-gather 한 번 + reduce-scatter 한 번", "one all-gather and one reduce-scatter per unit")}
GATHER = Text("모으기는 all_gather_into_tensor(또는 all_gather)로 하세요: 0으로 채운 버퍼를 all-reduce하면 바이트가 두 배입니다"
              "(all-reduce = reduce-scatter + all-gather).",
              "gather with all_gather_into_tensor (or all_gather): all-reducing a zero-filled buffer moves twice the bytes "
              "(an all-reduce is a reduce-scatter plus an all-gather).")
SCATTER = Text("그래디언트는 reduce_scatter_tensor로 각 랭크의 샤드 몫만 받으세요: 전체를 all-reduce하고 자르면 reduce-scatter의 두 배를 "
               "보냅니다. 파라미터 모으기도 all-gather로(all-reduce가 아니라).",
               "reduce-scatter the gradient (reduce_scatter_tensor) so each rank gets only its shard: all-reducing it all and "
               "slicing sends twice a reduce-scatter's bytes. Gather the parameters with an all-gather too (not an all-reduce).")
NO_REGATHER = Text("역전파에서도 전체 가중치가 필요합니다(grad_x = grad_out·W): 저장해 두지 말고 다시 all-gather하세요.",
                   "the backward needs the full weight too (grad_x = grad_out·W): all-gather it again rather than keep it.")


def _judge(case, fn, timeout):
    n, seed = case.world_size, case.params["seed"]
    outputs = harness.run(_body, n, (fn, seed), timeout)
    problem = _values(case, outputs, _reference(seed, n), n) or _cost(case, outputs, n)
    if problem:
        return problem
    held = max(o["out"]["held"] for o in outputs)
    return passed(case, Text(f"순전파 뒤 들고 있는 가장 큰 텐서 {held} B, 스텝마다 보낸 바이트 = all-gather 2번 + reduce-scatter 1번(유닛마다)",
                             f"largest tensor held after forward {held} B; bytes per step = 2 all-gathers + 1 "
                             "reduce-scatter per unit"))


STUB = '''class FSDPLinear(torch.autograd.Function):
    """ZeRO-3/FSDP 유닛: 파라미터가 랭크들에 나뉘어(sharded) 있는 Linear의 y = x·Wᵀ + b.
    shard: 이 랭크의 몫. 평평한(flat) 파라미터 = W.reshape(-1) 다음 b, 0으로 채워(padding) N·shard.numel()개로 만든 것의
    unit.rank번째 조각. unit.shape = W의 (out, in), unit.numel = out·in + out(패딩 전), unit.world_size, unit.rank.
    forward: 샤드들을 all-gather해 계산하고, 전체 파라미터는 버립니다(역전파용으로 x와 shard만 저장).
    backward: 다시 all-gather, grad_x와 평평한 그래디언트를 계산해 reduce-scatter(랭크 평균) -> (grad_x, grad_shard, None).
    목표(랭크마다 보내는 바이트): 순전파 all-gather 1번, 역전파 all-gather 1번 + reduce-scatter 1번, 각각 (N-1)/N·S. 순전파와
    역전파 사이에 전체 가중치만 한 텐서를 들고 있지 않습니다.
    An FSDP/ZeRO-3 unit: y = x·Wᵀ + b of a Linear whose parameters are sharded over the ranks. shard: this rank's
    piece, number unit.rank, of the flat parameters (W.reshape(-1), then b) zero-padded to N·shard.numel()
    elements. unit.shape = W's (out, in), unit.numel = out·in + out (before padding), unit.world_size, unit.rank.
    forward: all-gather the shards, compute, and drop the full parameters (save only x and shard for backward).
    backward: all-gather again, compute grad_x and the flat gradient, reduce-scatter it (averaged over the ranks)
    -> (grad_x, grad_shard, None). Target, bytes each rank sends: one all-gather in the forward, one all-gather and
    one reduce-scatter in the backward, (N-1)/N·S each; nothing as large as the full weight held between forward
    and backward."""

    @staticmethod
    def forward(ctx, x, shard, unit):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")

    @staticmethod
    def backward(ctx, grad_out):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

PADDED = Text("모은 평평한 벡터는 패딩되어 있습니다: W와 b로 나누기 전에 앞의 unit.numel개만 쓰세요.",
              "the gathered flat vector is padded: keep its first unit.numel elements before cutting it into W and b.")
CRASH_HINTS = (
    ("is invalid for input of size", PADDED),
    ("must match the existing size", PADDED),
    ("returned an invalid gradient at index 1", Text("backward의 두 번째 값은 이 랭크 샤드의 그래디언트(shard.numel()개)입니다: "
                                                      "평평한 그래디언트 전체가 아니라 reduce-scatter한 몫을 돌려주세요.",
                                                      "backward's second value is the gradient of this rank's shard "
                                                      "(shard.numel() elements): return the reduce-scattered piece, not the "
                                                      "whole flat gradient.")),
    ("outputShape[0] * worldSize == inputShape[0]", Text("reduce_scatter_tensor의 입력은 정확히 N·shard.numel()개여야 합니다: "
                                                         "평평한 그래디언트를 0으로 채워(pad) 그 길이로 맞춘 뒤 보내세요.",
                                                         "reduce_scatter_tensor's input must hold exactly N·shard.numel() "
                                                         "elements: zero-pad the flat gradient to that length first.")),
    ("world_size times", Text("all_gather_into_tensor의 출력은 N·shard.numel()개, reduce_scatter_tensor의 입력도 N·shard.numel()개"
                              "(패딩 포함)입니다.", "all_gather_into_tensor's output holds N·shard.numel() elements, and so does "
                              "reduce_scatter_tensor's input (padding included).")),
)

EXERCISES = [
    Exercise("fsdp_unit", "06", Text("FSDP(ZeRO-3) 유닛", "An FSDP (ZeRO-3) unit"), STUB, (
        Text("ZeRO-3에서는 파라미터도 나뉘어 있습니다: 계산하는 순간에만 전체를 모으고 바로 버립니다. 역전파에도 전체 W가 필요하니 다시 "
             "모읍니다.",
             "In ZeRO-3 the parameters are sharded too: the full ones exist only while a unit computes, then go. The "
             "backward needs the full W as well, so it gathers again."),
        Text("순전파: all-gather((N-1)/N·S). 역전파: all-gather((N-1)/N·S) + 그래디언트 reduce-scatter((N-1)/N·S) ÷ N. 합: DP의 "
             "1.5배. grad_x = grad_out·W, grad_W = grad_outᵀ·x, grad_b = grad_out.sum(0).",
             "Forward: all-gather ((N-1)/N·S). Backward: all-gather ((N-1)/N·S) + a reduce-scatter of the gradient "
             "((N-1)/N·S), divided by N. Total: 1.5x DP's. grad_x = grad_out·W, grad_W = grad_outᵀ·x, "
             "grad_b = grad_out.sum(0)."),
        Text("한 함수 full(shard, unit)로 모으기(all_gather_into_tensor, 앞 unit.numel개, W와 b로 나누기)를 쓰면 forward와 backward가 "
             "같이 씁니다. forward는 ctx.save_for_backward(x, shard)와 ctx.unit만 남깁니다. backward는 평평한 그래디언트를 패딩해 "
             "reduce_scatter_tensor로 보냅니다.",
             "One helper full(shard, unit) that gathers (all_gather_into_tensor, the first unit.numel elements, split "
             "into W and b) serves forward and backward. forward keeps only ctx.save_for_backward(x, shard) and "
             "ctx.unit; backward pads the flat gradient and sends it through reduce_scatter_tensor.")),
        [Case(Text("2 랭크, 2 스텝", "2 ranks, 2 steps"), 2, {"seed": 71}),
         Case(Text("3 랭크(나누어떨어지지 않는 샤드)", "3 ranks (uneven shards)"), 3, {"seed": 72}),
         Case(Text("4 랭크(나누어떨어지지 않는 샤드)", "4 ranks (uneven shards)"), 4, {"seed": 73})],
        _judge, uses="class", crash_hints=CRASH_HINTS, target="FSDPLinear"),
]
