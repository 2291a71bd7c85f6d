"""Lab 11 exercises, each graded on cost as well as values: Megatron's sequence-parallel mappings, ring
attention with the online-softmax merge, Ulysses' all-to-all swap, and an expert-parallel MoE layer
with a capacity.

- ``sequence_parallel_mappings``: the two autograd Functions that turn TP's f/g into an all-gather
  and a reduce-scatter along the sequence (dimension 0, Megatron's [s, b, h]). The checker runs an
  MLP block on each rank's sequence shard and compares output and gradients with one device; the
  pair must send, per forward and per backward, no more than TP's all-reduce of the same tensor.
- ``ring_attention_merge`` and ``ulysses_head_swap``: ``exercises/attention.py``.
- ``expert_parallel_moe``: ``exercises/experts.py``.

Bytes a rank sends are priced by ``traffic`` (lab 05's collectives: ring all-gather and
reduce-scatter (N-1)/N·S, all-reduce 2(N-1)/N·S, all-to-all (N-1)/N·S) and compared with a target
per phase of the step by ``phase_bytes``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mpkit.exercises import attention, experts, harness
from mpkit.exercises.common import Case, Exercise, close, factor_hint, failed, mismatch, passed, ratio, seeded
from mpkit.exercises.phase_bytes import kinds, missed, most_sent, over_target
from mpkit.exercises.result import Text

BATCH, HIDDEN, FFN = 2, 5, 8   # [s, b, h] activations; the MLP's 8 features split over the ranks (3, 3, 2 on 3)


def _weights(seed, seq):
    g = seeded(seed)
    return {"x": torch.randn(seq, BATCH, HIDDEN, generator=g), "w1": torch.randn(FFN, HIDDEN, generator=g) * 0.5,
            "b1": torch.randn(FFN, generator=g) * 0.1, "w2": torch.randn(HIDDEN, FFN, generator=g) * 0.5,
            "b2": torch.randn(HIDDEN, generator=g) * 0.1, "target": torch.randn(seq, BATCH, HIDDEN, generator=g)}


def _features(rank, n):
    return torch.arange(FFN).tensor_split(n)[rank]


def _tokens(rank, n, seq):
    return slice(rank * seq // n, (rank + 1) * seq // n)


def _partial(x, w, rank, n):
    """Rank ``rank``'s partial output of the row layer for the whole sequence ``x``."""
    cols = _features(rank, n)
    return F.linear(F.gelu(F.linear(x, w["w1"][cols], w["b1"][cols])), w["w2"][:, cols])


def _block_reference(seed, seq, n):
    """Per rank, what the sequence-parallel block must give, from the unsplit block on one device:
    this rank's output rows and gradients (its features of the TP layers; its tokens' part of b2's)."""
    w = _weights(seed, seq)
    leaves = {k: w[k].clone().requires_grad_() for k in ("x", "w1", "b1", "w2", "b2")}
    out = leaves["x"] + F.linear(F.gelu(F.linear(leaves["x"], leaves["w1"], leaves["b1"])), leaves["w2"], leaves["b2"])
    out.retain_grad()
    F.mse_loss(out, w["target"]).backward()
    per_rank = []
    for rank in range(n):
        rows, cols = _tokens(rank, n, seq), _features(rank, n)
        per_rank.append({"out": out.detach()[rows], "x": leaves["x"].grad[rows], "w1": leaves["w1"].grad[cols],
                         "b1": leaves["b1"].grad[cols], "w2": leaves["w2"].grad[:, cols],
                         "b2": out.grad[rows].sum((0, 1))})
    return per_rank, out.grad


def _sp_body(ctx, recorder, pair, seed, seq):
    gather, scatter = pair
    n, r = ctx.world_size, ctx.rank
    w = _weights(seed, seq)
    rows, cols = _tokens(r, n, seq), _features(r, n)
    p = {"x": w["x"][rows], "w1": w["w1"][cols], "b1": w["b1"][cols], "w2": w["w2"][:, cols], "b2": w["b2"]}
    p = {k: v.clone().requires_grad_() for k, v in p.items()}

    def block(p):
        h = F.gelu(F.linear(gather.apply(p["x"]), p["w1"], p["b1"]))   # the column layer needs every token
        return p["x"] + scatter.apply(F.linear(h, p["w2"])) + p["b2"]   # the row layer's sum, this rank's tokens
    recorder.phase = "forward"
    out = recorder.call(block, p)
    loss = ((out - w["target"][rows]) ** 2).sum() / w["target"].numel()   # the ranks' losses add up to the mean
    recorder.phase = "backward"
    recorder.call(loss.backward)
    return {"out": out.detach(), **{k: None if v.grad is None else v.grad.clone() for k, v in p.items()}}


SP_NAMES = {"out": ("출력(이 랭크의 토큰)", "the output (this rank's tokens)"), "x": ("입력의 그래디언트", "the input's gradient"),
            "w1": ("열 병렬 가중치의 그래디언트", "the column layer's weight gradient"),
            "b1": ("열 병렬 편향의 그래디언트", "the column layer's bias gradient"),
            "w2": ("행 병렬 가중치의 그래디언트", "the row layer's weight gradient"),
            "b2": ("행 병렬 편향의 그래디언트(이 랭크 토큰의 부분합)", "the row layer's bias gradient (this rank's tokens' part)")}
GATHERS = ("all_gather", "all_gather_into_tensor")
NO_SUM = Text("ReduceScatter의 순전파가 합하지 않고 이 랭크의 토큰만 잘랐습니다: 행 병렬 레이어의 출력은 랭크마다 부분합이니 reduce-scatter로 "
              "더하면서 나누세요.",
              "ReduceScatter's forward kept this rank's tokens without summing: the row layer's output is a partial "
              "sum on every rank; reduce-scatter adds them up while it splits.")
GATHER_BACKWARD = Text("Gather의 역전파가 그래디언트를 reduce-scatter하지 않았습니다: 모은 시퀀스는 이 랭크의 열 병렬 조각으로 흘러가므로 그 그래디언트는 "
                       "랭크마다 부분합입니다. 잘라내기만 하면 다른 랭크의 몫이 빠집니다(Megatron의 tensor_parallel_output_grad=True).",
                       "Gather's backward did not reduce-scatter the gradient: the gathered sequence feeds this rank's "
                       "slice of the column layer, so its gradient is a partial sum on every rank; slicing it drops the "
                       "other ranks' parts (Megatron's tensor_parallel_output_grad=True).")
SCATTER_BACKWARD = Text("ReduceScatter의 역전파는 all-gather입니다: 이 랭크의 부분합은 모든 토큰의 출력에 들어갔으니, 모든 랭크의 토큰 그래디언트를 "
                        "모아 [s, b, h]로 돌려주세요.",
                        "ReduceScatter's backward is an all-gather: this rank's partial sum went into every token's "
                        "output, so gather every rank's token gradients back into [s, b, h].")
ORDER = Text("시퀀스는 랭크 순서대로 이어 붙입니다: 랭크 j의 조각이 행 j·s/N..(j+1)·s/N-1이고(차원 0), reduce-scatter 뒤 랭크 r은 "
             "r번째 조각을 가집니다.",
             "the sequence is laid out in rank order: rank j's shard is rows j·s/N..(j+1)·s/N-1 (dimension 0), and "
             "after the reduce-scatter rank r keeps shard r.")


def _sp_hint(key, want, got, n, rank, calls, extra):
    """The recognised mistake behind a wrong tensor, from its value and the calls of its phase."""
    if key == "out":
        if close(extra["no_sum"][rank], got):
            return NO_SUM
        hint = factor_hint(ratio(want - extra["rest"][rank], got - extra["rest"][rank]), n, "sum") \
            if isinstance(got, torch.Tensor) and got.shape == want.shape else None
        return hint or ORDER
    through = extra["residual"][rank] if key == "x" else 0   # x's gradient: the residual's plus the block's
    factor = factor_hint(ratio(want - through, got - through), n, "sum") \
        if isinstance(got, torch.Tensor) and got.shape == want.shape else None
    if factor is not None:
        return factor
    if key == "x" and isinstance(got, torch.Tensor) and close(extra["sliced"][rank], got):
        return GATHER_BACKWARD
    if not set(kinds(calls, "backward")) & {*GATHERS, "all_reduce", "send"}:
        return SCATTER_BACKWARD
    return GATHER_BACKWARD if key == "x" else SCATTER_BACKWARD


def _sp_alternatives(seed, seq, n, grad_out):
    """What the classic mistakes give: the output without the sum (each rank its own partial), the
    input gradient when Gather's backward only slices (each rank its own partial), and the part of
    the input gradient that comes through the residual (the rest goes through the block)."""
    w = _weights(seed, seq)
    no_sum, rest, sliced, residual = [], [], [], []
    for rank in range(n):
        rows = _tokens(rank, n, seq)
        x = w["x"].clone().requires_grad_()
        mine = _partial(x, w, rank, n)
        mine.backward(grad_out)
        rest.append(w["x"][rows] + w["b2"])
        no_sum.append(rest[-1] + mine.detach()[rows])
        sliced.append(grad_out[rows] + x.grad[rows])
        residual.append(grad_out[rows])
    return {"no_sum": no_sum, "rest": rest, "sliced": sliced, "residual": residual}


def _sp_cost(case, outputs, n, seq):
    size = seq * BATCH * HIDDEN * 4
    target = 2 * (n - 1) * size // n   # TP's all-reduce of the [s, b, h] tensor: one all-gather + one reduce-scatter
    found = over_target(outputs, n, target)
    if found is None:
        return None
    return missed(case, found, target, Text(
        f"[s, b, h] 텐서(S = {size} B)의 TP all-reduce가 보내는 양, 곧 all-gather 한 번 + reduce-scatter 한 번((N-1)/N·S씩)",
        f"what TP's all-reduce of the [s, b, h] tensor (S = {size} B) sends: one all-gather + one reduce-scatter "
        f"((N-1)/N·S each)"), ALL_REDUCE if "all_reduce" in found[-1] else EXTRA_BYTES)

ALL_REDUCE = Text("all-reduce 하나가 이미 2(N-1)/N·S를 보냅니다(= reduce-scatter + all-gather): 전체를 all-reduce하고 자르거나, 0으로 채운 버퍼를 "
                  "all-reduce해 모으면 쌍의 바이트가 1.5~2배가 됩니다. reduce_scatter_tensor와 all_gather_into_tensor를 쓰세요.",
                  "one all-reduce already sends 2(N-1)/N·S (= a reduce-scatter + an all-gather): all-reducing the whole "
                  "tensor and slicing it, or gathering by all-reducing a zero-filled buffer, makes the pair send 1.5-2x "
                  "its bytes. Use reduce_scatter_tensor and all_gather_into_tensor.")
EXTRA_BYTES = Text("쌍은 TP의 all-reduce와 같은 바이트만 보냅니다: 방향마다 all-gather 한 번과 reduce-scatter 한 번. 같은 텐서를 두 번 "
                   "보내거나, 필요 없는 집합 통신이 있는지 보세요.",
                   "the pair sends exactly TP's all-reduce bytes: one all-gather and one reduce-scatter per direction. Look "
                   "for a tensor sent twice or a collective that is not needed.")


def _judge_sp(case, pair, timeout):
    n, seed, seq = case.world_size, case.params["seed"], case.params["seq"]
    outputs = harness.run(_sp_body, n, (pair, seed, seq), timeout)
    expected, grad_out = _block_reference(seed, seq, n)
    extra = None
    for rank, (want, output) in enumerate(zip(expected, outputs)):
        for key, (ko, en) in SP_NAMES.items():
            got = output["out"][key]
            if not close(want[key], got):
                extra = extra or _sp_alternatives(seed, seq, n, grad_out)
                return failed(case, mismatch(Text(f"랭크 {rank}, {ko}:", f"rank {rank}, {en}:"), want[key], got),
                              _sp_hint(key, want[key], got, n, rank, output["calls"], extra))
    problem = _sp_cost(case, outputs, n, seq)
    if problem:
        return problem
    size = seq * BATCH * HIDDEN * 4
    most = most_sent(outputs, n)
    return passed(case, Text(f"방향마다 랭크당 최대 {most} B = TP all-reduce의 {2 * (n - 1) * size // n} B",
                             f"at most {most} B per rank and direction = TP's all-reduce, {2 * (n - 1) * size // n} B"))


SP_STUB = '''class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """시퀀스 병렬 구역에서 열 병렬 레이어 앞: 순전파는 시퀀스 all-gather [s/N, b, h] -> [s, b, h](시퀀스가 차원 0,
    Megatron의 배치; 랭크 j의 조각이 행 j·s/N부터), 역전파는 그래디언트의 reduce-scatter [s, b, h] -> [s/N, b, h](랭크마다
    부분합인 그래디언트를 더해 이 랭크의 토큰 몫만).
    In front of a column-parallel layer in a sequence-parallel region: forward all-gathers the sequence,
    [s/N, b, h] -> [s, b, h] (the sequence is dimension 0, Megatron's layout; rank j's shard starts at row j·s/N);
    backward reduce-scatters the gradient, [s, b, h] -> [s/N, b, h] (the ranks' partial gradients summed, this
    rank's tokens kept)."""

    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """행 병렬 레이어 뒤: 순전파는 랭크들의 부분합 [s, b, h]를 reduce-scatter해 이 랭크 토큰의 합 [s/N, b, h]만, 역전파는
    all-gather [s/N, b, h] -> [s, b, h]. s는 N으로 나누어떨어집니다(Megatron도 요구).
    비용 목표: 순전파에서도 역전파에서도 이 쌍이 랭크마다 보내는 바이트가 같은 [s, b, h] 텐서의 TP all-reduce, 2(N-1)/N·S 이하
    (all-gather 한 번 + reduce-scatter 한 번, (N-1)/N·S씩).
    After a row-parallel layer: forward reduce-scatters the ranks' partial sums [s, b, h] into the sum for this
    rank's tokens [s/N, b, h]; backward all-gathers [s/N, b, h] -> [s, b, h]. N divides s (Megatron requires it).
    Cost target: in the forward and in the backward the pair sends per rank at most what TP's all-reduce of the
    same [s, b, h] tensor sends, 2(N-1)/N·S (one all-gather + one reduce-scatter, (N-1)/N·S each)."""

    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

SP_CRASH_HINTS = (
    ("returned an invalid gradient",
     Text("역전파는 순전파 입력과 같은 모양의 그래디언트를 돌려줍니다: Gather는 [s/N, b, h]([s, b, h] 그래디언트를 reduce-scatter), "
          "ReduceScatter는 [s, b, h]([s/N, b, h] 그래디언트를 all-gather).",
          "a backward returns a gradient shaped like its forward's input: Gather's is [s/N, b, h] (reduce-scatter the "
          "[s, b, h] gradient), ReduceScatter's [s, b, h] (all-gather the [s/N, b, h] gradient).")),
    ("at non-singleton dimension 1", Text("시퀀스는 차원 0입니다([s, b, h]): 모으기와 reduce-scatter는 dim=0을 따라 하세요"
                                          "(차원 1은 배치).", "the sequence is dimension 0 ([s, b, h]): gather and "
                                          "reduce-scatter along dim=0 (dimension 1 is the batch).")),
    ("world_size times", Text("all_gather_into_tensor의 출력은 입력의 N배(차원 0), reduce_scatter_tensor의 입력은 출력의 N배입니다.",
                              "all_gather_into_tensor's output is N times its input (along dimension 0), and "
                              "reduce_scatter_tensor's input N times its output.")),
)

SP_CASES = [Case(Text("2 랭크, s=4, b=2, h=5", "2 ranks, s=4, b=2, h=5"), 2, {"seed": 111, "seq": 4}),
            Case(Text("3 랭크, s=6(특성 8개를 3,3,2로)", "3 ranks, s=6 (8 features as 3, 3, 2)"), 3, {"seed": 112, "seq": 6}),
            Case(Text("4 랭크, s=8", "4 ranks, s=8"), 4, {"seed": 113, "seq": 8})]

SEQUENCE_PARALLEL = Exercise(
    "sequence_parallel_mappings", "11",
    Text("시퀀스 병렬화의 all-gather와 reduce-scatter (autograd Function)",
         "Sequence parallelism's all-gather and reduce-scatter (autograd Functions)"), SP_STUB, (
        Text("TP의 g(all-reduce)는 reduce-scatter + all-gather입니다. 시퀀스 병렬화는 그 둘을 떼어 행 병렬 레이어 뒤에 reduce-scatter, 다음 "
             "열 병렬 레이어 앞에 all-gather를 두어, 그 사이의 LayerNorm·드롭아웃·잔차는 s/N개 토큰만 봅니다. 각 연산의 역전파는 짝(켤레)입니다.",
             "TP's g (an all-reduce) is a reduce-scatter + an all-gather. Sequence parallelism pulls them apart: a "
             "reduce-scatter after the row layer, an all-gather before the next column layer, so the LayerNorms, "
             "dropouts and residuals in between see s/N tokens. Each one's backward is the other (its conjugate)."),
        Text("Gather: y = cat_j x_j (차원 0), dL/dx_r = Σ_j (dL/dy_j)[r번째 조각] — reduce-scatter. ReduceScatter: y_r = (Σ_j x_j)[r번째 조각], "
             "dL/dx_j = cat_r dL/dy_r — all-gather. 바이트: 각각 (N-1)/N·S, 합 2(N-1)/N·S = all-reduce.",
             "Gather: y = cat_j x_j (dimension 0), dL/dx_r = Σ_j (dL/dy_j)[shard r] — a reduce-scatter. ReduceScatter: "
             "y_r = (Σ_j x_j)[shard r], dL/dx_j = cat_r dL/dy_r — an all-gather. Bytes: (N-1)/N·S each, 2(N-1)/N·S "
             "together = an all-reduce."),
        Text("도우미 두 개가 일을 다 합니다: 차원 0으로 모으기(출력이 N배 길이, all_gather_into_tensor)와 reduce-scatter(출력이 1/N "
             "길이, reduce_scatter_tensor). 네 메서드는 각각 그중 하나를 부릅니다. 어느 것을 부를지가 켤레(conjugate)의 문제입니다. "
             "입력은 .contiguous()로.",
             "Two helpers do all the work: a gather along dimension 0 (output N times as long, all_gather_into_tensor) and "
             "a reduce-scatter (output 1/N as long, reduce_scatter_tensor). Each of the four methods calls one of them; "
             "which one is the conjugate question. Pass .contiguous() inputs.")),
    SP_CASES, _judge_sp, uses="pair", crash_hints=SP_CRASH_HINTS,
    target="(GatherFromSequenceParallelRegion, ReduceScatterToSequenceParallelRegion)")

EXERCISES = [SEQUENCE_PARALLEL, *attention.EXERCISES, *experts.EXERCISES]
