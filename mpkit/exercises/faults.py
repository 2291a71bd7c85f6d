"""Lab 12 exercises: resharding a 1-D tensor saved by n ranks onto m ranks, and choosing how often
to checkpoint.

``reshard_reads``: each of n saving ranks wrote its ``tensor_split`` chunk; each of m loading ranks
needs its own chunk. The learner lists, per loading rank, the pieces it copies (saved rank, global
start, stop); the checker cross-checks against DCP itself: the read items
``torch.distributed.checkpoint``'s ``create_read_items_for_chunk_list`` (its resharding) plans for
the same chunks. ``checkpoint_every``: the steps between checkpoints nearest Young's sqrt(2·δ·M)
and the first-order waste δ/τ + τ/(2M) of that interval (``sim.formulas.young_interval``).
"""
from __future__ import annotations

import math

import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorProperties, TensorStorageMetadata
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from mpkit.exercises.common import Case, Exercise, failed, passed, pure_results
from mpkit.exercises.result import Text
from mpkit.simulator.formulas import young_interval


# ---- resharding ----

def chunk_bounds(numel: int, ranks: int) -> list[tuple[int, int]]:
    """[start, stop) of each rank's ``tensor_split`` chunk."""
    sizes = [len(piece) for piece in torch.empty(numel).tensor_split(ranks)]
    return [(sum(sizes[:r]), sum(sizes[:r + 1])) for r in range(ranks)]


def dcp_reads(numel: int, saved_ranks: int, new_ranks: int) -> list[list[tuple[int, int, int]]]:
    """What DCP's resharding plans: per loading rank, (saved rank, start, stop) of each read item."""
    saved = chunk_bounds(numel, saved_ranks)
    md = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([numel]),
                               [ChunkStorageMetadata(torch.Size([a]), torch.Size([b - a])) for a, b in saved])
    owner = {a: r for r, (a, _) in enumerate(saved)}
    out = []
    for a, b in chunk_bounds(numel, new_ranks):
        items = create_read_items_for_chunk_list("t", md, [ChunkStorageMetadata(torch.Size([a]), torch.Size([b - a]))])
        reads = [(owner[i.storage_index.offset[0]], a + i.dest_offsets[0], a + i.dest_offsets[0] + i.lengths[0])
                 for i in items]
        out.append(sorted(reads, key=lambda read: read[1]))
    return out


def _normal(reads):
    try:
        return [sorted((int(r), int(a), int(b)) for r, a, b in rank) for rank in reads]
    except (TypeError, ValueError):
        return None


def _reshard_hint(numel, n, m, got):
    """The classic mistakes, recognised by the reads they give."""
    whole = [[(r, a, b) for r, (a, b) in enumerate(chunk_bounds(numel, n)) if a < hi and lo < b]
             for lo, hi in chunk_bounds(numel, m)]
    inclusive = [[(r, a, b - 1) for r, a, b in rank] for rank in dcp_reads(numel, n, m)]
    floor = [[(r, max(a, lo), min(b, hi)) for r, (a, b) in enumerate(_floor_bounds(numel, n)) if a < hi and lo < b]
             for lo, hi in _floor_bounds(numel, m)]
    local = [[(r, a - chunk_bounds(numel, n)[r][0], b - chunk_bounds(numel, n)[r][0]) for r, a, b in rank]
             for rank in dcp_reads(numel, n, m)]
    for variant, hint in (
            (local, Text("범위를 저장 조각 안의 위치(지역 오프셋)로 적었습니다: start와 stop은 전체 텐서의 위치(전역 오프셋)입니다.",
                         "you gave offsets local to the saved chunk: start and stop are positions in the whole tensor "
                         "(global offsets).")),
            (whole, Text("저장된 조각을 통째로 읽었습니다: 겹치는 부분 [max(시작), min(끝))만 복사합니다(파일 읽기는 조각째일 수 있지만, "
                         "복사하는 범위는 겹침뿐).", "you listed whole saved chunks: a rank copies only the overlap "
                         "[max(starts), min(stops)) (the file reader may read the chunk whole; what it copies is the "
                         "overlap).")),
            (inclusive, Text("끝을 포함해 적었습니다: 범위는 반열린 구간 [start, stop)입니다.",
                             "you gave inclusive stops: ranges are half-open, [start, stop).")),
            (floor, Text("경계를 numel // ranks로 잘랐습니다: tensor_split은 앞쪽 numel % ranks개 조각에 하나씩 더 줍니다.",
                         "you cut at multiples of numel // ranks: tensor_split gives one more element to the first "
                         "numel % ranks chunks."))):
        if _normal(variant) == got:
            return hint
    if got is not None and any(a >= b for rank in got for _, a, b in rank):
        return Text("빈 읽기(start >= stop)가 있습니다: 겹치지 않는 저장 조각은 빼세요(길이 0인 범위는 목록에 넣지 않습니다).",
                    "some reads are empty (start >= stop): leave out the saved chunks that do not overlap (no "
                    "zero-length ranges in the list).")
    return None


def _floor_bounds(numel, ranks):
    k = numel // ranks
    return [(r * k, numel if r == ranks - 1 else (r + 1) * k) for r in range(ranks)]


def _judge_reshard(case, fn, timeout):
    calls = case.params["calls"]
    for args, value in zip(calls, pure_results(fn, calls, timeout)):
        numel, n, m = args
        want, got = dcp_reads(*args), _normal(value) if isinstance(value, (list, tuple)) else None
        call = f"reshard_reads(numel={numel}, saved_ranks={n}, new_ranks={m})"
        if got is None or len(got) != m:
            return failed(case, Text(f"{call}: 새 랭크 {m}개 각각의 (저장 랭크, start, stop) 목록을 기대했는데 {value!r}입니다.",
                                     f"{call}: expected one list of (saved rank, start, stop) per new rank ({m}), got "
                                     f"{value!r}."))
        for rank, (w, g) in enumerate(zip(want, got)):
            if w != g:
                return failed(case, Text(f"{call}, 새 랭크 {rank}: 기댓값 {w}, 실제 {g}.",
                                         f"{call}, new rank {rank}: expected {w}, got {g}."),
                              _reshard_hint(numel, n, m, got))
    return passed(case)


# ---- the checkpoint interval ----

def expected_interval(step_seconds, checkpoint_seconds, mtbf_seconds):
    every = max(1, round(young_interval(checkpoint_seconds, mtbf_seconds) / step_seconds))
    tau = every * step_seconds
    return every, checkpoint_seconds / tau + tau / (2 * mtbf_seconds)


def _interval_hint(args, got_every, got_waste):
    step, c, m = args
    if got_every == max(1, round(math.sqrt(c * m) / step)):
        return Text("√(C·M)을 썼습니다: Young의 간격은 √(2·C·M)입니다.", "you used √(C·M): Young's interval is √(2·C·M).")
    if got_every == max(1, round(young_interval(c, m / 3600) / step)):
        return Text("M을 시간 단위로 넣었습니다: 모든 값은 초 단위입니다.", "you used M in hours: every value is in seconds.")
    if got_every == round(young_interval(c, m)) or got_every == young_interval(c, m):
        return Text("초를 돌려주었습니다: τ를 스텝 시간으로 나눈 스텝 수(정수)를 돌려주세요.",
                    "you returned seconds: return a number of steps, τ divided by the step time.")
    exact = young_interval(c, m) / step
    if got_every in (math.floor(exact), math.ceil(exact)) and got_every != max(1, round(exact)):
        return Text(f"τ/스텝 = {exact:.2f}을(를) 가장 가까운 정수가 아니라 내림(floor)이나 올림으로 바꾸었습니다: round()로 가장 "
                    "가까운 스텝 수를 고르세요(최소 1).", f"τ/step = {exact:.2f} was rounded down (floor) or up instead of to "
                    "the nearest whole step: use round() (at least 1).")
    tau = got_every * step if isinstance(got_every, (int, float)) else None
    if tau and isinstance(got_waste, (int, float)):
        if math.isclose(got_waste, c / tau + tau / m, rel_tol=1e-6):
            return Text("장애 하나가 평균적으로 잃는 작업은 τ 전체가 아니라 τ/2입니다: τ/(2M).",
                        "a failure loses half an interval on average, τ/2, not τ: the term is τ/(2M).")
        if math.isclose(got_waste, c / tau, rel_tol=1e-6):
            return Text("저장 비용 C/τ만 넣었습니다: 장애로 잃는 작업 τ/(2M)도 더하세요.",
                        "you counted only the saving cost C/τ: add the work lost to failures, τ/(2M).")
    return None


def _judge_interval(case, fn, timeout):
    calls = case.params["calls"]
    for args, value in zip(calls, pure_results(fn, calls, timeout)):
        want_every, want_waste = expected_interval(*args)
        call = f"checkpoint_every(step_seconds={args[0]}, checkpoint_seconds={args[1]}, mtbf_seconds={args[2]:g})"
        ok = isinstance(value, (tuple, list)) and len(value) == 2
        every, waste = value if ok else (None, None)
        if not ok or every != want_every or not isinstance(waste, (int, float)) \
                or not math.isclose(waste, want_waste, rel_tol=1e-6):
            return failed(case, Text(f"{call}: 기댓값 ({want_every}, {want_waste:.6g}), 실제 {value!r}.",
                                     f"{call}: expected ({want_every}, {want_waste:.6g}), got {value!r}."),
                          _interval_hint(args, every, waste) if ok else None)
    return passed(case)


STUB_RESHARD = '''def reshard_reads(numel, saved_ranks, new_ranks):
    """1차원 텐서(원소 numel개)를 saved_ranks개 랭크가 저장했습니다: 랭크 r의 조각은 tensor_split(saved_ranks)[r]입니다.
    new_ranks개 랭크가 같은 방식으로 나누어 불러옵니다. 새 랭크마다 읽을 조각들의 목록
    [(저장 랭크, start, stop), ...] 을 돌려주세요: 그 저장 랭크의 조각에서 복사하는 전역 범위 [start, stop).
    A 1-D tensor of numel elements was saved by saved_ranks ranks, rank r holding tensor_split(saved_ranks)[r]; it is
    loaded by new_ranks ranks split the same way. Return, per new rank, its reads [(saved rank, start, stop), ...]:
    the global range [start, stop) it copies from that saved rank's chunk."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''
STUB_INTERVAL = '''def checkpoint_every(step_seconds, checkpoint_seconds, mtbf_seconds):
    """스텝이 step_seconds초, 체크포인트 저장이 checkpoint_seconds초(C), 평균 고장 간격이 mtbf_seconds초(M)일 때
    (몇 스텝마다 저장할지, 그 간격의 낭비 비율)을 돌려주세요. 스텝 수는 Young의 √(2·C·M)에 가장 가까운 정수(최소 1),
    낭비는 1차 근사 C/τ + τ/(2M) (τ = 스텝 수 × 스텝 시간).
    Return (save every how many steps, the share of time wasted at that interval) for steps of step_seconds, a
    checkpoint costing checkpoint_seconds (C) and a mean time between failures of mtbf_seconds (M): the whole number
    of steps nearest Young's √(2·C·M) (at least 1), and the first-order waste C/τ + τ/(2M) with τ = steps × step time."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

RESHARD_CALLS = [(12, 4, 3), (10, 3, 4), (7, 2, 5), (16, 4, 4), (9, 1, 3), (13, 5, 2)]
# Llama 3 405B's MTBF (419 interruptions in 54 days = 11,135 s), a laptop's 10 minutes, a cluster's 24 h
INTERVAL_CALLS = [(10, 60, 54 * 86400 / 419), (2, 30, 600), (1, 300, 86400), (60, 5, 3600), (30, 20, 1800),
                  (600, 5, 600)]  # the last: Young's interval is far under one step, so every step

EXERCISES = [
    Exercise("reshard_reads", "12", Text("1차원 텐서의 재샤딩: n개 랭크에서 m개 랭크로", "Resharding a 1-D tensor from n "
                                         "ranks to m"), STUB_RESHARD, (
        Text("새 랭크가 읽는 것은 자기 범위와 저장된 조각들이 겹치는 부분뿐입니다.",
             "A new rank reads only where its own range overlaps the saved chunks."),
        Text("[a, b)와 [c, d)의 겹침: [max(a, c), min(b, d)), 비어 있지 않으면(max < min). 경계는 tensor_split의 크기로.",
             "The overlap of [a, b) and [c, d) is [max(a, c), min(b, d)) when max < min. Bounds from tensor_split's sizes."),
        Text("bounds(k) = tensor_split(k)의 [start, stop) 목록\n새 랭크 (lo, hi)마다: 저장 랭크 (a, b)와 겹치면 "
             "(랭크, max(a, lo), min(b, hi))",
             "bounds(k) = the [start, stop) of tensor_split(k)\nfor each new rank (lo, hi): for each saved rank (a, b) that "
             "overlaps, (rank, max(a, lo), min(b, hi))")),
        [Case(Text("나누어떨어지는 크기", "sizes that divide"), 1, {"calls": RESHARD_CALLS[:2]}),
         Case(Text("나누어떨어지지 않는 크기", "uneven sizes"), 1, {"calls": RESHARD_CALLS[2:]})],
        _judge_reshard),
    Exercise("checkpoint_every", "12", Text("체크포인트 간격 고르기", "Choosing the checkpoint interval"), STUB_INTERVAL, (
        Text("자주 저장하면 저장 비용이, 드물게 저장하면 장애 때 다시 하는 작업이 늘어납니다: 합이 가장 작은 곳.",
             "Saving often costs saves; saving rarely costs the work redone after a failure: find the smallest sum."),
        Text("낭비 ≈ C/τ + τ/(2M)을 τ로 미분해 0: τ = √(2·C·M) (Young 1974).",
             "waste ≈ C/τ + τ/(2M); set its derivative to 0: τ = √(2·C·M) (Young 1974)."),
        Text("every = max(1, round(sqrt(2*C*M) / step_seconds))\ntau = every * step_seconds\n"
             "return every, C / tau + tau / (2 * M)",
             "every = max(1, round(sqrt(2*C*M) / step_seconds))\ntau = every * step_seconds\n"
             "return every, C / tau + tau / (2 * M)")),
        [Case(Text("Llama 3의 고장 빈도와 두 기계", "Llama 3's failure rate and two machines"), 1,
              {"calls": INTERVAL_CALLS[:3]}),
         Case(Text("저장이 싸거나 고장이 잦을 때(스텝 하나보다 짧은 간격 포함)", "cheap saves, frequent failures (an interval "
                   "under one step too)"), 1, {"calls": INTERVAL_CALLS[3:]})],
        _judge_interval),
]
