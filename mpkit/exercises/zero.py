"""Lab 06 exercise: one ZeRO-1 step on a flat parameter vector.

Each rank owns one contiguous shard of the parameters (``tensor_split`` boundaries) and keeps the
optimizer state for that shard only. A step: reduce-scatter the gradients (average), update the
own shard, all-gather the updated parameters. The optimizer given to the learner (SGD with
momentum, so a summed gradient shows) records which elements each rank updated: the shards must
partition the vector, and after three steps every rank's parameters must equal the unsharded
optimizer's on the averaged gradients, sending no more than one reduce-scatter and one all-gather.
"""
from __future__ import annotations

import torch

from mpkit.exercises import harness
from mpkit.exercises.common import Case, Exercise, close, failed, mismatch, passed, seeded
from mpkit.exercises.result import Text
from mpkit.exercises.traffic import sent
from mpkit.parallel.collectives import bytes_per_rank

LR, MOMENTUM, STEPS = 0.1, 0.9, 3


class ShardOptimizer:
    """SGD with momentum over shards: ``step(start, param_shard, grad_shard)`` updates
    ``param_shard`` (elements ``start..start+len`` of the flat vector) in place and keeps a momentum
    buffer per ``start``; it records the range so the checker can see the shard boundaries."""

    def __init__(self):
        self.momentum, self.ranges = {}, []

    def step(self, start, param_shard, grad_shard):
        if param_shard.shape != grad_shard.shape:
            raise ValueError(f"param_shard has shape {tuple(param_shard.shape)} but grad_shard {tuple(grad_shard.shape)}: "
                             "pass the same elements of both")
        buf = self.momentum.setdefault(int(start), torch.zeros_like(grad_shard))
        buf.mul_(MOMENTUM).add_(grad_shard)
        param_shard.sub_(LR * buf)
        self.ranges.append((int(start), int(start) + param_shard.numel()))


def _grad(seed, rank, step, numel):
    return torch.randn(numel, generator=seeded(seed + 100 * step + rank))


def _params(seed, numel):
    return torch.randn(numel, generator=seeded(seed + 99))


def _body(ctx, recorder, fn, seed, numel):
    params, opt, ranges = _params(seed, numel), ShardOptimizer(), []
    for step in range(STEPS):
        opt.ranges = []
        recorder.call(fn, ctx, params, _grad(seed, ctx.rank, step, numel), opt)
        ranges.append(opt.ranges)
    return {"params": params, "ranges": ranges}


def _reference(seed, numel, n, divide_by=None, own_rank=None):
    """The parameters after the steps: the averaged gradient by default; ``divide_by`` another
    divisor of the summed gradient (1: summed, n*n: divided twice); ``own_rank``: that rank's
    gradient alone (no communication)."""
    params, buf = _params(seed, numel), torch.zeros(numel)
    for step in range(STEPS):
        if own_rank is None:
            g = torch.stack([_grad(seed, r, step, numel) for r in range(n)]).sum(0) / (divide_by or n)
        else:
            g = _grad(seed, own_rank, step, numel)
        buf = buf * MOMENTUM + g
        params = params - LR * buf
    return params


def _variant_hint(seed, numel, n, got):
    """The classic ZeRO-1 mistakes, recognised by the parameters they produce."""
    pieces = [piece.numel() for piece in torch.empty(numel).tensor_split(n)]
    starts = [sum(pieces[:r]) for r in range(n)]
    local = torch.cat([_reference(seed, numel, n, own_rank=r)[s:s + k] for r, (s, k) in enumerate(zip(starts, pieces))])
    for variant, hint in (
            (_reference(seed, numel, n, divide_by=1), Text("그래디언트를 합하기만 하고 world_size로 나누지 않았습니다(평균이어야 함).",
                                                           "the gradients were summed, not averaged (divide by the world size).")),
            (_reference(seed, numel, n, divide_by=n * n), Text("평균을 world_size로 한 번 더 나누었습니다.",
                                                               "the average was divided by the world size once more.")),
            (local, Text("각 랭크가 자기 그래디언트만으로 갱신했습니다: 먼저 reduce-scatter(또는 all-reduce)로 평균 그래디언트의 "
                         "자기 몫을 구하세요.", "each rank updated with its own gradient only: first get your shard of the "
                         "averaged gradient (reduce-scatter, or all-reduce then slice).")),
            (_params(seed, numel), Text("파라미터가 전혀 바뀌지 않았습니다: optimizer.step에 복사본이 아니라 params의 뷰(params[start:end])를 "
                                        "넘기세요.", "the parameters never changed: give optimizer.step a view of params "
                                        "(params[start:end]), not a copy."))):
        if close(variant, got):
            return hint
    return None


def _judge(case, fn, timeout):
    n, seed, numel = case.world_size, case.params["seed"], case.params["numel"]
    outputs = harness.run(_body, n, (fn, seed, numel), timeout)
    for step in range(STEPS):
        covered = sorted((r, lo, hi) for r, o in enumerate(outputs) for lo, hi in o["out"]["ranges"][step] if hi > lo)
        where = Text(f"{step + 1}번째 스텝:", f"step {step + 1}:")
        whole = [r for r, lo, hi in covered if hi - lo == numel and n > 1]
        if whole:
            return failed(case, where + Text(f"랭크 {whole[0]}이(가) 벡터 전체를 갱신했습니다.",
                                             f"rank {whole[0]} updated the whole vector."),
                          Text("ZeRO-1에서 각 랭크는 자기 샤드만 갱신하고(옵티마이저 상태도 그 샤드만), 나머지는 all-gather로 받습니다.",
                               "in ZeRO-1 each rank updates only its own shard (and keeps optimizer state for it "
                               "only); it gets the rest by all-gather."))
        for (r1, lo1, hi1), (r2, lo2, hi2) in zip(covered, covered[1:]):
            if lo2 < hi1:
                return failed(case, where + Text(f"랭크 {r1}이(가) {lo1}..{hi1 - 1}, 랭크 {r2}이(가) {lo2}..{hi2 - 1}을(를) "
                                                 "갱신했습니다: 겹칩니다.", f"rank {r1} updated elements {lo1}..{hi1 - 1} and rank "
                                                 f"{r2} {lo2}..{hi2 - 1}: they overlap."), BOUNDARY_HINT)
        owned = sum(hi - lo for _, lo, hi in covered)
        if owned != numel or any(len(o["out"]["ranges"][step]) > 1 for o in outputs):
            return failed(case, where + Text(f"샤드들이 {numel}개 원소 중 {owned}개를 덮습니다(각 랭크는 연속된 한 조각).",
                                             f"the shards cover {owned} of {numel} elements (each rank one contiguous "
                                             "piece)."), BOUNDARY_HINT)
    want = _reference(seed, numel, n)
    for rank, output in enumerate(outputs):
        got = output["out"]["params"]
        if not close(want, got):
            own = [(lo, hi) for lo, hi in output["out"]["ranges"][-1]]
            hint = _variant_hint(seed, numel, n, got)
            if hint is None and own and close(want[own[0][0]:own[0][1]], got[own[0][0]:own[0][1]]):
                hint = Text("자기 샤드는 맞지만 다른 샤드가 낡았습니다: 갱신 뒤 all-gather로 모든 랭크에 새 파라미터를 모으세요.",
                            "this rank's own shard is right but the others are stale: all-gather the updated shards "
                            "into every rank's parameters after the update.")
            return failed(case, mismatch(Text(f"랭크 {rank}, {STEPS}스텝 뒤 파라미터:", f"rank {rank}, parameters after "
                                              f"{STEPS} steps:"), want, got), hint)
    return _bytes_problem(case, outputs, numel) or passed(case)


def _bytes_problem(case, outputs, numel):
    """ZeRO-1's cost target: per step, a rank sends no more than one reduce-scatter and one all-gather
    of the gradient padded to equal pieces; an all-reduce in their place costs 1.5x DP, two cost 2x."""
    n = case.world_size
    width = -(-numel // n)
    target = 2 * bytes_per_rank("reduce_scatter", n * width * 4, n, 0)
    dp = bytes_per_rank("all_reduce", numel * 4, n, 0)
    for rank, output in enumerate(outputs):
        per_step = sent(output["calls"], n, rank) / STEPS
        if per_step > target:
            return failed(case, Text(f"값은 맞지만 랭크 {rank}이(가) 스텝마다 {per_step:.0f} B를 보냅니다: ZeRO-1의 목표는 "
                                     f"reduce-scatter 한 번과 all-gather 한 번, {target} B입니다(DP의 all-reduce는 {dp} B, "
                                     f"지금은 그 {per_step / dp:.2g}배).",
                                     f"the values are right but rank {rank} sends {per_step:.0f} B per step: ZeRO-1's target "
                                     f"is one reduce-scatter and one all-gather, {target} B (DP's all-reduce: {dp} B; "
                                     f"this is {per_step / dp:.2g}x that)."),
                          Text("all-reduce는 reduce-scatter의 두 배를 보냅니다: 그래디언트는 reduce_scatter_tensor로 자기 샤드만 "
                               "받고(같은 크기로 채워서), 갱신한 샤드는 all_gather_into_tensor로 모으세요. 전체 all-reduce를 두 번 "
                               "하면 DP의 두 배, all-reduce 뒤 all-gather(또는 broadcast)는 1.5배입니다.",
                               "an all-reduce sends twice a reduce-scatter's bytes: get only your shard of the gradient "
                               "with reduce_scatter_tensor (padded to equal pieces) and gather the updated shards with "
                               "all_gather_into_tensor. Two full all-reduces cost twice DP's bytes; an all-reduce then an "
                               "all-gather (or broadcasts) 1.5x."))
    return None


BOUNDARY_HINT = Text("샤드 경계가 어긋났습니다(하나 차이?): 랭크 r의 샤드는 flat.tensor_split(N)[r]처럼 [시작, 끝)으로 나누면 "
                     "겹치지도 비지도 않습니다.", "shard boundaries are off (by one?): cutting half-open ranges [start, end), "
                     "as flat.tensor_split(N)[r] does, leaves no gap and no overlap.")

STUB = '''def zero1_step(ctx, params, grad, optimizer):
    """ZeRO-1 한 스텝. params는 모든 랭크에 같은 1차원 파라미터 벡터(제자리에서 갱신), grad는 이 랭크의 그래디언트입니다.
    이 랭크의 샤드(params.tensor_split(N)[랭크]처럼 연속된 한 조각)만 갱신하세요:
    optimizer.step(start, param_shard, grad_shard)가 그 샤드를 제자리에서 갱신하고 샤드의 옵티마이저 상태를 가집니다.
    1) 평균 그래디언트의 자기 샤드(reduce-scatter), 2) optimizer.step, 3) 갱신된 샤드를 모두에게(all-gather).
    목표: 스텝마다 reduce-scatter 한 번과 all-gather 한 번만큼만 보냅니다(all-reduce 한 번의 바이트).
    One ZeRO-1 step. params is the flat parameter vector, the same on every rank (update it in place); grad is this
    rank's gradient. Update only this rank's shard (one contiguous piece, like params.tensor_split(N)[rank]):
    optimizer.step(start, param_shard, grad_shard) updates that shard in place and holds its optimizer state.
    1) this shard of the averaged gradient (reduce-scatter), 2) optimizer.step, 3) every shard to everyone (all-gather).
    Sizes may not divide evenly. Target: per step, send no more than one reduce-scatter and one all-gather (the bytes
    of one all-reduce)."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

EXERCISES = [
    Exercise("zero1_step", "06", Text("ZeRO-1 한 스텝", "One ZeRO-1 step"), STUB, (
        Text("옵티마이저 상태를 N개로 나누면 각 랭크는 자기 샤드의 평균 그래디언트만 필요합니다.",
             "With the optimizer state split N ways, each rank needs the averaged gradient of its own shard only."),
        Text("reduce-scatter: 평균의 자기 몫 ((N-1)/N·S). all-gather: 갱신된 샤드 ((N-1)/N·S). 합치면 all-reduce와 같은 바이트.",
             "reduce-scatter: your piece of the average ((N-1)/N·S); all-gather: the updated shards ((N-1)/N·S). Together, "
             "the bytes of one all-reduce."),
        Text("sizes = [len(x) for x in params.tensor_split(N)]; w = max(sizes); 각 조각을 w개로 채운(pad) 벡터를 만들고\n"
             "dist.reduce_scatter_tensor(g, padded_grad); g /= N\noptimizer.step(start, params[start:end], g[:sizes[랭크]])\n"
             "dist.all_gather_into_tensor(out, 채운 자기 샤드) 뒤 각 조각의 앞 sizes[i]개를 params에 복사",
             "sizes = [len(x) for x in params.tensor_split(N)]; w = max(sizes); pad each piece to w elements\n"
             "dist.reduce_scatter_tensor(g, padded_grad); g /= N\noptimizer.step(start, params[start:end], g[:sizes[rank]])\n"
             "dist.all_gather_into_tensor(out, your padded shard), then copy the first sizes[i] of each piece into params")),
        [Case(Text("2 랭크, 12개 원소", "2 ranks, 12 elements"), 2, {"seed": 41, "numel": 12}),
         Case(Text("4 랭크, 10개 원소(나누어떨어지지 않음)", "4 ranks, 10 elements (uneven)"), 4, {"seed": 42, "numel": 10}),
         Case(Text("3 랭크, 7개 원소", "3 ranks, 7 elements"), 3, {"seed": 43, "numel": 7})],
        _judge),
]
