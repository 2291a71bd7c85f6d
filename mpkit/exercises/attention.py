"""Lab 11 exercises on context parallelism: ring attention with the online-softmax merge, and
Ulysses' all-to-all swap of sequence and heads. Both are checked against causal attention over the
whole sequence on one device, in float64.

Ring attention: rank r holds chunks r and 2N-1-r of the 2N chunks of the sequence (the load-balanced
split) and returns its queries' output (in the input's dtype) and their log-sum-exp (float32). A
bf16 case tells fp32 statistics from bf16 ones: computed in fp32 and rounded once, every output
element lies within one bf16 unit in the last place of the exact value (measured: at most half of
one), while a bf16 accumulator or bf16 scores drift by tens of them. Cost: N-1 hops of this rank's
K/V block to one neighbour, (N-1)·(bytes of k + v) = 2·(N-1)/N·b·s·h_kv·e per rank, and no
collective (an all-gather of K/V sends the same bytes, but every rank then holds every K/V: that is
Llama 3's all-gather CP, not a ring).

Ulysses: rank r holds block r of the sequence for every head; all-to-alls give each rank every
token for H/N heads, attention runs there, and an all-to-all swaps back; forward and backward are
checked. Cost: per direction at most 4·(N-1)/N·L bytes (q, k, v and the output, L = one of them
on one rank), an all-to-all's share; an all-gather sends N times that.

The recognised mistakes are told apart by what they compute: the checker evaluates the classic
wrong versions (no causal mask, a mask from the contiguous split or from local indices, no
1/√d scale, attention over this rank's own block only) and names the one the answer equals.
"""
from __future__ import annotations

import torch

from mpkit.exercises import harness
from mpkit.exercises.common import Case, Exercise, close, factor_hint, failed, mismatch, passed, ratio, seeded
from mpkit.exercises.phase_bytes import kinds, missed, most_sent, over_target
from mpkit.exercises.result import Text

# ---- shared: data, positions and the reference ----


def _qkv(seed, shape, dtype=torch.float32):
    g = seeded(seed)
    return [torch.randn(*shape, generator=g).to(dtype) for _ in range(4)]   # q, k, v and an output gradient


def zigzag(seq, n, rank):
    """Positions of ``rank``'s tokens under the load-balanced split: chunks rank and 2N-1-rank of 2N."""
    chunks = torch.arange(seq).chunk(2 * n)
    return torch.cat([chunks[rank], chunks[2 * n - 1 - rank]])


def attention(q, k, v, mask=None, scale=None):
    """(out, lse) of attention in float64; ``mask[i, j]``: query i may see key j (default causal)."""
    q, k, v = (t.double() for t in (q, k, v))
    seq = q.shape[-2]
    mask = torch.ones(seq, seq, dtype=torch.bool).tril() if mask is None else mask
    scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


def _bf16_close(expected, got) -> bool:
    """Within one bf16 unit in the last place of each exact value (fp32 statistics, one rounding)."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return False
    exact = expected.double()
    ulp = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(2.0 ** -100))) - 7)
    return bool(((got.double() - exact).abs() <= ulp + 1e-6).all())


def _about(expected, got, loose) -> bool:
    """Close for a float32 case, or within bf16 rounding (2% of the largest value) when ``loose``."""
    if not loose:
        return close(expected, got)
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or not torch.isfinite(got.double()).all():
        return False
    return bool((got.double() - expected).abs().max() <= 0.02 * max(1.0, expected.abs().max().item()))


# ---- ring attention ----

def _ring_body(ctx, recorder, fn, seed, shape, dtype):
    q, k, v, _ = _qkv(seed, shape, dtype)
    mine = zigzag(shape[2], ctx.world_size, ctx.rank)
    recorder.phase = "forward"
    result = recorder.call(fn, ctx, q[:, :, mine].clone(), k[:, :, mine].clone(), v[:, :, mine].clone())
    if isinstance(result, (tuple, list)) and len(result) == 2:
        return {"out": _detached(result[0]), "lse": _detached(result[1])}
    return {"returned": repr(result)[:200]}


def _detached(t):
    return t.detach().clone() if isinstance(t, torch.Tensor) else t


def _ring_alternatives(q, k, v, n):
    """The classic wrong rings as whole-sequence attention with another mask or scale."""
    seq = q.shape[2]
    order = torch.cat([zigzag(seq, n, r) for r in range(n)])   # actual position of each (rank, local row)
    believed = torch.empty(seq, dtype=torch.long)
    believed[order] = torch.arange(seq)                        # ... taken for block r of a contiguous split
    local = torch.empty(seq, dtype=torch.long)
    local[order] = torch.arange(seq) % (seq // n)              # the row's index on its own rank
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    return [(NO_MASK, attention(q, k, v, torch.ones_like(causal))),
            (CONTIGUOUS, attention(q, k, v, believed[:, None] >= believed[None, :])),
            (LOCAL_INDEX, attention(q, k, v, local[:, None] >= local[None, :])),
            (NO_SCALE, attention(q, k, v, causal, scale=1.0))]


NO_MASK = Text("인과 마스크(causal mask)가 없습니다: query는 자기 위치 이하의 key만 봅니다(전역 위치로 비교).",
               "there is no causal mask: a query sees only keys at or before its own position (compare global "
               "positions).")
CONTIGUOUS = Text("랭크 r이 연속된 블록 r을 가진다고 보고 마스크를 만들었습니다: 부하 균형 분할에서 랭크 r은 2N개 조각 중 r번째와 2N-1-r번째를 "
                  "가집니다. 블록마다 query와 key의 전역 위치로 마스크를 만드세요(위치 i의 query는 위치 j ≤ i의 key만).",
                  "the mask assumes rank r holds the contiguous block r: under the load-balanced split rank r holds "
                  "chunks r and 2N-1-r of 2N. Build each block's mask from the global positions of its queries and keys "
                  "(the query at i sees keys j <= i).")
LOCAL_INDEX = Text("마스크를 랭크 안의 행 번호로 만들었습니다(블록마다 triu): 인과 마스크는 전역 위치로 정합니다. 다른 랭크의 K/V 블록은 "
                   "위치에 따라 전부, 일부, 또는 전혀 보이지 않습니다.",
                   "the mask uses row numbers within a rank (a triu on every block): the causal mask follows global "
                   "positions. Another rank's K/V block is fully visible, partly, or not at all, depending on where its "
                   "chunks lie.")
NO_SCALE = Text("점수를 1/√d로 나누지 않았습니다: s = q·kᵀ / √(head_dim).", "the scores are not scaled by 1/√d: s = q·kᵀ / √(head_dim).")
NAN = Text("출력에 NaN이 있습니다: 한 블록의 key가 모두 가려진 query는 그 블록의 lse가 -inf라서 exp(s - lse)가 NaN입니다. -inf를 0으로 바꿔 "
           "빼거나(torch.where) 그 블록을 건너뛰고, 합칠 때는 torch.logaddexp를 쓰세요.",
           "the output has NaN: a query whose keys in a block are all masked has lse = -inf there, and exp(s - lse) "
           "is NaN. Subtract a finite value instead (torch.where(lse == -inf, 0, lse)) or skip that block, and merge "
           "with torch.logaddexp.")
RESCALE = Text("lse는 맞는데 출력이 다릅니다: 블록마다의 부분 출력을 그대로 더하거나 평균하지 말고 새 lse로 다시 맞추세요: "
               "out = exp(lse_old − lse)·out + exp(lse_i − lse)·out_i, lse = logaddexp(lse_old, lse_i).",
               "the lse is right but the output is not: do not add or average the blocks' partial outputs as they are; "
               "rescale them to the new lse: out = exp(lse_old − lse)·out + exp(lse_i − lse)·out_i, "
               "lse = logaddexp(lse_old, lse_i).")
LSE = Text("출력은 맞는데 lse가 다릅니다: 돌려줄 lse는 모든 블록을 합친 log Σ_j exp(s_ij)입니다(마지막 블록의 것이나 최댓값이 아니라).",
           "the output is right but the lse is not: return the merged log Σ_j exp(s_ij) over every block (not the last "
           "block's, nor the running maximum).")
FP32 = Text("bf16 입력에서 통계가 bf16입니다: 점수, lse, 출력 누적을 fp32로(q.float()) 계산하고 마지막에 한 번만 q.dtype으로 바꾸세요. "
            "bf16으로 합치면 블록마다 반올림이 쌓입니다.",
            "with bf16 inputs the statistics are bf16: compute the scores, the lse and the output accumulator in fp32 "
            "(q.float()) and cast to q.dtype once, at the end. Merging in bf16 rounds at every block.")
MERGE = Text("블록을 합치는 규칙을 확인하세요: 블록마다 s = q·kᵀ/√d(전역 위치로 인과 마스크), lse_i = logsumexp(s), "
             "out_i = softmax(s)·v; 합치기는 lse = logaddexp(lse, lse_i), out = Σ exp(lse_i − lse)·out_i. K/V 블록의 주인은 "
             "(r − step) mod N입니다(받는 방향에 맞게).",
             "check the merge: per block s = q·kᵀ/√d (causal mask from global positions), lse_i = logsumexp(s), out_i = "
             "softmax(s)·v; merge lse = logaddexp(lse, lse_i), out = Σ exp(lse_i − lse)·out_i. The K/V block you hold "
             "at step t belongs to rank (r − t) mod N (for blocks passed from r-1 to r).")
RETURN_PAIR = Text("(out, lse)를 돌려주세요: out은 q와 같은 모양과 dtype, lse는 [b, heads, 2c]의 float32.",
                   "return (out, lse): out with q's shape and dtype, lse float32 of shape [b, heads, 2c].")


def _ring_values(case, outputs, q, k, v, n, dtype):
    out, lse = attention(q, k, v)
    loose = dtype != torch.float32
    alternatives = None
    for rank, output in enumerate(outputs):
        got = output["out"]
        if "returned" in got:
            return failed(case, Text(f"랭크 {rank}이(가) {got['returned']}을(를) 돌려주었습니다.",
                                     f"rank {rank} returned {got['returned']}."), RETURN_PAIR)
        mine = zigzag(q.shape[2], n, rank)
        want_out, want_lse = out[:, :, mine], lse[:, :, mine]
        where = Text(f"랭크 {rank}:", f"rank {rank}:")
        if isinstance(got["out"], torch.Tensor) and got["out"].dtype != dtype:
            return failed(case, where + Text(f"출력의 dtype이 {got['out'].dtype}입니다({dtype}이어야 함).",
                                             f"the output's dtype is {got['out'].dtype}, not {dtype}."), RETURN_PAIR)
        if isinstance(got["lse"], torch.Tensor) and got["lse"].dtype != torch.float32:
            return failed(case, where + Text(f"lse의 dtype이 {got['lse'].dtype}입니다(float32이어야 함).",
                                             f"the lse's dtype is {got['lse'].dtype}, not float32."),
                          FP32 if got["lse"].dtype in (torch.bfloat16, torch.float16) else RETURN_PAIR)
        out_ok = _bf16_close(want_out, got["out"]) if loose else close(want_out, got["out"])
        lse_ok = close(want_lse, got["lse"], 1e-5 if not loose else 1e-4)
        if out_ok and lse_ok:
            continue
        shown = (Text(f"랭크 {rank}, 출력:", f"rank {rank}, the output:"), want_out, got["out"]) if not out_ok else \
            (Text(f"랭크 {rank}, lse:", f"rank {rank}, the lse:"), want_lse, got["lse"])
        hint = None
        if isinstance(got["out"], torch.Tensor) and not torch.isfinite(got["out"].double()).all():
            hint = NAN
        elif loose and _about(want_out, got["out"], True) and _about(want_lse, got["lse"], True):
            hint = FP32
        else:
            alternatives = alternatives or _ring_alternatives(q, k, v, n)
            hint = next((h for h, (alt_out, alt_lse) in alternatives
                         if _about(alt_out[:, :, mine], got["out"], loose)), None)
            hint = hint or (RESCALE if lse_ok else LSE if _about(want_out, got["out"], loose) else MERGE)
        return failed(case, mismatch(*shown), hint)
    return None


ONE_NEIGHBOUR = Text("링에서는 K/V 블록을 한 이웃에게만 넘기고(N-1번), 받은 블록을 다음 단계에 다시 넘깁니다: 모든 랭크에 직접 보내면 all-gather와 "
                     "같아서 모든 K/V를 한꺼번에 들고 있게 됩니다.",
                     "a ring passes the K/V block to one neighbour only (N-1 times), forwarding what it received at the next "
                     "step: sending to every rank directly is an all-gather, and every rank holds all K/V at once.")
NO_COLLECTIVE = Text("K/V를 all-gather(또는 다른 집합 통신)로 모으면 바이트는 같아도 모든 랭크가 시퀀스 전체의 K/V를 한꺼번에 듭니다: 그것은 "
                     "Llama 3의 all-gather CP입니다. 링은 isend/irecv로 이웃에게 블록을 넘기며, 넘기는 동안 지금 블록을 계산합니다.",
                     "gathering K/V with an all-gather (or another collective) sends the same bytes, but every rank then "
                     "holds the whole sequence's K/V at once: that is Llama 3's all-gather CP. A ring passes blocks to a "
                     "neighbour with isend/irecv and computes the current block while the next one travels.")
EXTRA_HOPS = Text("K/V 블록은 N-1번만 넘기면 됩니다: N번째 홉은 자기 블록을 되돌려받을 뿐이고, q나 출력을 보낼 필요는 없습니다.",
                  "the K/V block needs N-1 hops: an N-th hop only brings your own block back, and neither q nor the output "
                  "needs to travel.")


def _ring_cost(case, outputs, n, kv_bytes):
    target = (n - 1) * kv_bytes
    for rank, output in enumerate(outputs):
        calls = output["calls"]
        collectives = [kind for kind in kinds(calls) if kind not in ("send", "recv")]
        if collectives:
            return failed(case, Text(f"랭크 {rank}이(가) {', '.join(collectives)}을(를) 불렀습니다. 목표: 이웃 하나와 점대점 메시지만"
                                     f"(K/V N-1번, {target} B).",
                                     f"rank {rank} called {', '.join(collectives)}; the target is point-to-point messages to "
                                     f"one neighbour only (K/V N-1 times, {target} B)."), NO_COLLECTIVE)
        peers = sorted({c.peer for c in calls if c.kind == "send" and c.peer is not None})
        if len(peers) > 1:
            return failed(case, Text(f"랭크 {rank}이(가) 랭크 {peers}에게 보냈습니다. 목표: 링의 이웃 하나.",
                                     f"rank {rank} sent to ranks {peers}; the target is one ring neighbour."), ONE_NEIGHBOUR)
        measured = sum(c.nbytes for c in calls if c.kind == "send")
        if measured > target:
            return failed(case, Text(f"랭크 {rank}: {measured} B를 보냈습니다. 목표: {target} B 이하 = K와 V 블록({kv_bytes} B)의 N-1번 홉"
                                     f"(2·(N-1)/N·b·s·h_kv·e).",
                                     f"rank {rank} sent {measured} B; the target is at most {target} B = N-1 hops of the K "
                                     f"and V block ({kv_bytes} B), 2·(N-1)/N·b·s·h_kv·e."), EXTRA_HOPS)
    return None


def _judge_ring(case, fn, timeout):
    n, seed, shape = case.world_size, case.params["seed"], case.params["shape"]
    dtype = case.params.get("dtype", torch.float32)
    outputs = harness.run(_ring_body, n, (fn, seed, shape, dtype), timeout)
    q, k, v, _ = _qkv(seed, shape, dtype)
    problem = _ring_values(case, outputs, q, k, v, n, dtype)
    if problem:
        return problem
    kv_bytes = 2 * k.element_size() * k.numel() // n
    problem = _ring_cost(case, outputs, n, kv_bytes)
    if problem:
        return problem
    most = max(sum(c.nbytes for c in o["calls"] if c.kind == "send") for o in outputs)
    return passed(case, Text(f"랭크당 최대 {most} B = K/V 블록 {n - 1}번 홉",
                             f"at most {most} B per rank = {n - 1} hop{'s' if n > 2 else ''} of the K/V block"))


RING_STUB = '''def ring_attention_merge(ctx, q, k, v):
    """링 어텐션(ring attention), 인과 마스크(causal mask). q, k, v: [b, heads, 2c, d], 이 랭크의 토큰들 — 시퀀스를 같은 크기
    조각 2N개로 나눈 것 중 r번째와 2N-1-r번째(부하 균형 분할, r = ctx.rank, N = ctx.world_size), 그 순서로 이어 붙인 것.
    K/V 블록을 링으로 N-1번 넘기며 블록마다 부분 softmax를 계산하고 log-sum-exp로 합칩니다: lse = log Σ_i exp(lse_i),
    out = Σ_i exp(lse_i − lse)·out_i. 점수는 q·kᵀ/√d, 위치 i의 query는 위치 j ≤ i의 key만 봅니다. 점수·lse·출력 누적은
    fp32(입력이 bf16이어도), 돌려줄 것: (out: q의 dtype, lse: [b, heads, 2c] float32).
    비용 목표: 랭크마다 이웃 하나에게 K/V 블록을 N-1번, 곧 (N-1)·(k와 v의 바이트) = 2·(N-1)/N·b·s·h_kv·e. all-gather 없이.
    Ring attention with a causal mask. q, k, v: [b, heads, 2c, d], this rank's tokens: chunks r and 2N-1-r of the
    sequence cut into 2N equal chunks (the load-balanced split, r = ctx.rank, N = ctx.world_size), in that order.
    Pass the K/V block around the ring N-1 times, compute a partial softmax per block and merge by log-sum-exp:
    lse = log Σ_i exp(lse_i), out = Σ_i exp(lse_i − lse)·out_i. Scores are q·kᵀ/√d; the query at position i sees
    keys at positions j <= i. Scores, lse and output accumulator in fp32 (also for bf16 inputs); return
    (out in q's dtype, lse float32 of shape [b, heads, 2c]).
    Cost target: per rank N-1 hops of its K/V block to one neighbour, (N-1)·(bytes of k and v) =
    2·(N-1)/N·b·s·h_kv·e; no all-gather."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

RING = Exercise(
    "ring_attention_merge", "11", Text("링 어텐션: log-sum-exp로 합치기, 부하 균형 인과 마스크",
                                 "Ring attention: the log-sum-exp merge and the load-balanced causal mask"), RING_STUB, (
        Text("query는 자기 랭크에 두고 K/V 블록만 돌립니다. 블록마다 softmax를 따로 구해도, 각 블록의 log-sum-exp를 알면 전체 softmax로 "
             "정확히 합칠 수 있습니다(블록마다 분모가 다를 뿐).",
             "Keep the queries on their rank and pass only the K/V blocks around. A softmax computed per block merges "
             "exactly into the whole softmax once you know each block's log-sum-exp (only the denominators differ)."),
        Text("블록 i: s = q·kᵀ/√d에 마스크(query 위치 ≥ key 위치), lse_i = logsumexp(s, -1), out_i = exp(s − lse_i)·v. 합치기: "
             "new = logaddexp(lse, lse_i), out = exp(lse − new)·out + exp(lse_i − new)·out_i. 랭크 r의 위치: 조각 r과 2N-1-r "
             "(조각 크기 c = q.shape[2] // 2).",
             "Block i: s = q·kᵀ/√d masked (query position >= key position), lse_i = logsumexp(s, -1), out_i = exp(s − "
             "lse_i)·v. Merge: new = logaddexp(lse, lse_i), out = exp(lse − new)·out + exp(lse_i − new)·out_i. Rank r's "
             "positions: chunks r and 2N-1-r (chunk size c = q.shape[2] // 2)."),
        Text("positions(rank)를 먼저 만드세요. out = zeros(fp32), lse = full(-inf)로 시작해 step = 0..N-1마다: (마지막이 아니면) "
             "다음 블록의 isend/irecv를 걸고, 주인 = (r − step) % N의 블록을 계산해 합치고, wait() 뒤 받은 블록으로 바꿉니다. "
             "key가 하나도 안 보이는 행은 lse_i = -inf이니 exp에 넣기 전에 0으로 바꿔 빼세요.",
             "Write positions(rank) first. Start from out = zeros (fp32) and lse = full(-inf); for step = 0..N-1: "
             "(unless last) post the isend/irecv of the next block, compute and merge the block owned by (r − step) % "
             "N, then wait() and take the received block. A row that sees no key of a block has lse_i = -inf: "
             "subtract 0 instead before exp.")),
    [Case(Text("2 랭크, fp32, s=8", "2 ranks, fp32, s=8"), 2, {"seed": 121, "shape": (1, 2, 8, 4)}),
     Case(Text("3 랭크, fp32, 조각마다 토큰 1개, heads=3, d=5", "3 ranks, fp32, one token per chunk, heads=3, d=5"), 3,
          {"seed": 122, "shape": (2, 3, 6, 5)}),
     Case(Text("4 랭크, bf16 입력(fp32 통계), s=16", "4 ranks, bf16 inputs (fp32 statistics), s=16"), 4,
          {"seed": 123, "shape": (1, 2, 16, 8), "dtype": torch.bfloat16})],
    _judge_ring)


# ---- Ulysses ----

def _ulysses_body(ctx, recorder, fn, seed, shape):
    q, k, v, grad = _qkv(seed, shape)
    rows = slice(ctx.rank * shape[2] // ctx.world_size, (ctx.rank + 1) * shape[2] // ctx.world_size)
    leaves = [t[:, :, rows].clone().requires_grad_() for t in (q, k, v)]
    recorder.phase = "forward"
    out = recorder.call(fn, ctx, *leaves)
    if not isinstance(out, torch.Tensor) or not out.requires_grad or out.shape != leaves[0].shape:
        return {"out": _detached(out), "grads": None}
    recorder.phase = "backward"
    recorder.call(out.backward, grad[:, :, rows])
    return {"out": out.detach(), "grads": [None if t.grad is None else t.grad.clone() for t in leaves]}


def _ulysses_reference(q, k, v, grad):
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    out, _ = attention(*leaves)
    out.backward(grad.double())
    return out.detach(), [t.grad for t in leaves]


NOT_DIFFERENTIABLE = Text("출력이 그래프에 이어지지 않았습니다: dist.all_to_all_single은 미분되지 않습니다. all-to-all을 autograd Function으로 "
                          "감싸고, 그 backward는 두 차원을 바꾼 같은 all-to-all(역방향 교환)로 하세요.",
                          "the output is not connected to the graph: dist.all_to_all_single is not differentiable. Wrap the "
                          "all-to-all in an autograd Function whose backward is the same all-to-all with the two dimensions "
                          "swapped (the reverse exchange).")
LAYOUT = Text("all_to_all_single은 입력을 차원 0에서 N개 블록으로 잘라 블록 j를 랭크 j에 보내고, 받은 것을 랭크 순서로 차원 0에 쌓습니다: 헤드를 "
              "N묶음으로 잘라 맨 앞 차원에 쌓아(torch.stack(x.chunk(N, dim=1))) 보내고, 받은 블록들은 시퀀스 차원(2)으로 랭크 순서대로 "
              "이어 붙이세요. 되돌릴 때는 반대로.",
              "all_to_all_single cuts its input along dimension 0 into N blocks, sends block j to rank j, and stacks what "
              "it receives along dimension 0 in rank order: cut the heads into N groups stacked in front "
              "(torch.stack(x.chunk(N, dim=1))), send, and join the received blocks along the sequence dimension (2) in "
              "rank order. Back again the other way round.")
OWN_BLOCK = Text("각 랭크가 자기 시퀀스 블록만 보고 어텐션했습니다: 어텐션은 모든 토큰이 필요합니다. all-to-all로 헤드 H/N개의 시퀀스 전체를 "
                 "모은 뒤 계산하세요.",
                 "each rank attended over its own block of the sequence only: attention needs every token. All-to-all "
                 "first, so that each rank holds the whole sequence for H/N heads.")
CAUSAL = Text("인과 마스크가 없습니다: 모은 시퀀스는 랭크 순서대로 이어진 전체라서 is_causal=True(또는 위치 i ≥ j 마스크)가 그대로 맞습니다.",
              "there is no causal mask: the gathered sequence is the whole one in rank order, so is_causal=True (or a "
              "mask position i >= j) applies as it is.")
BACKWARD_SWAP = Text("all-to-all의 backward는 거꾸로 교환합니다(scatter 차원과 gather 차원을 바꿔서): 각 그래디언트 블록은 그 값이 온 랭크로 "
                     "돌아갑니다. 순전파와 같은 방향으로 교환하면 블록이(또는 그 모양이) 뒤섞입니다.",
                     "an all-to-all's backward exchanges the other way (scatter and gather dimensions swapped), so every "
                     "gradient block returns to the rank its values came from; exchanging in the forward's direction "
                     "mixes up the blocks (or their shapes).")
ALL_GATHER = Text("all-gather는 텐서마다 (N-1)·L을 보냅니다(all-to-all의 N배): 각 랭크는 모든 토큰 중 자기 헤드 H/N개만 필요하니 all-to-all로 "
                  "자기 몫만 받으세요.",
                  "an all-gather sends (N-1)·L per tensor (N times an all-to-all's (N-1)/N·L): each rank needs only its "
                  "H/N heads of every token, so receive just that share with an all-to-all.")
EXTRA_EXCHANGE = Text("방향마다 all-to-all 네 번(q, k, v 앞, 출력 뒤)이면 충분합니다: 같은 텐서를 두 번 보내거나 필요 없는 통신이 있는지 보세요.",
                      "four all-to-alls per direction are enough (q, k and v before, the output after): look for a tensor "
                      "sent twice or a message that is not needed.")


def _ulysses_values(case, outputs, q, k, v, grad, n):
    want_out, want_grads = _ulysses_reference(q, k, v, grad)
    seq = q.shape[2]
    for rank, output in enumerate(outputs):
        rows = slice(rank * seq // n, (rank + 1) * seq // n)
        got = output["out"]
        where = Text(f"랭크 {rank}, 출력:", f"rank {rank}, the output:")
        if not close(want_out[:, :, rows], got["out"]):
            hint = None
            if isinstance(got["out"], torch.Tensor) and got["out"].shape == want_out[:, :, rows].shape:
                hint = CAUSAL if close(attention(q, k, v, torch.ones(seq, seq, dtype=torch.bool))[0][:, :, rows],
                                       got["out"]) else \
                    OWN_BLOCK if close(attention(q[:, :, rows], k[:, :, rows], v[:, :, rows])[0], got["out"]) else LAYOUT
            return failed(case, mismatch(where, want_out[:, :, rows], got["out"]), hint)
        if got["grads"] is None:
            return failed(case, Text(f"랭크 {rank}: 출력이 q, k, v에서 미분되지 않습니다(requires_grad가 없음).",
                                     f"rank {rank}: the output is not differentiable in q, k, v (no requires_grad)."),
                          NOT_DIFFERENTIABLE)
        for name, want, have in zip("qkv", want_grads, got["grads"]):
            where = Text(f"랭크 {rank}, {name}의 그래디언트:", f"rank {rank}, the gradient of {name}:")
            if have is None:
                return failed(case, where + Text("None입니다.", "it is None."), NOT_DIFFERENTIABLE)
            if not close(want[:, :, rows], have):
                hint = factor_hint(ratio(want[:, :, rows], have), n, "sum") or BACKWARD_SWAP
                return failed(case, mismatch(where, want[:, :, rows], have), hint)
    return None


def _ulysses_cost(case, outputs, n, local_bytes):
    target = 4 * (n - 1) * local_bytes // n
    found = over_target(outputs, n, target)
    if found is None:
        return None
    return missed(case, found, target, Text(
        f"q, k, v, 출력의 all-to-all 네 번, 각각 (N-1)/N·L(L = 한 랭크의 텐서 하나, {local_bytes} B)",
        f"four all-to-alls (q, k, v, the output), (N-1)/N·L each (L = one tensor on one rank, {local_bytes} B)"),
        ALL_GATHER if {"all_gather", "all_gather_into_tensor"} & set(found[-1]) else EXTRA_EXCHANGE)

def _judge_ulysses(case, fn, timeout):
    n, seed, shape = case.world_size, case.params["seed"], case.params["shape"]
    outputs = harness.run(_ulysses_body, n, (fn, seed, shape), timeout)
    q, k, v, grad = _qkv(seed, shape)
    problem = _ulysses_values(case, outputs, q, k, v, grad, n)
    if problem:
        return problem
    local_bytes = 4 * q.numel() // n
    problem = _ulysses_cost(case, outputs, n, local_bytes)
    if problem:
        return problem
    most = most_sent(outputs, n)
    return passed(case, Text(f"방향마다 랭크당 최대 {most} B = all-to-all 네 번", f"at most {most} B per rank and direction = "
                             "four all-to-alls"))


ULYSSES_STUB = '''def ulysses_head_swap(ctx, q, k, v):
    """Ulysses 어텐션, 인과 마스크. q, k, v: [b, H, s/N, d], 이 랭크의 연속된 시퀀스 블록(랭크 r은 토큰 r·s/N..(r+1)·s/N-1),
    헤드는 전부. all-to-all로 [b, H, s/N, d] -> [b, H/N, s, d](헤드 H/N개의 시퀀스 전체; 랭크 r은 헤드 r·H/N..),
    그 위에서 보통의 인과 어텐션(F.scaled_dot_product_attention(..., is_causal=True)), all-to-all로 되돌려 [b, H, s/N, d]를
    돌려줍니다. N은 H와 s를 나눕니다. 역전파도 검사합니다: 출력은 q, k, v에서 미분되어야 합니다.
    비용 목표: 순전파와 역전파 각각 랭크마다 4·(N-1)/N·L 바이트 이하(q, k, v, 출력의 all-to-all 네 번; L = 이 랭크의 q 바이트).
    all-gather 없이.
    Ulysses attention with a causal mask. q, k, v: [b, H, s/N, d], this rank's contiguous block of the sequence
    (rank r holds tokens r·s/N..(r+1)·s/N-1) for every head. All-to-all [b, H, s/N, d] -> [b, H/N, s, d] (the
    whole sequence for H/N heads; rank r takes heads r·H/N..), run ordinary causal attention there
    (F.scaled_dot_product_attention(..., is_causal=True)), all-to-all back and return [b, H, s/N, d]. N divides H
    and s. The backward is checked too: the output must be differentiable in q, k, v.
    Cost target: per rank, in the forward and in the backward, at most 4·(N-1)/N·L bytes (four all-to-alls: q, k,
    v, the output; L = this rank's q in bytes); no all-gather."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

ULYSSES = Exercise(
    "ulysses_head_swap", "11", Text("Ulysses: 시퀀스와 헤드를 바꾸는 all-to-all", "Ulysses: the all-to-all that swaps sequence and heads"),
    ULYSSES_STUB, (
        Text("어텐션은 헤드마다 따로입니다. 그러니 시퀀스를 나눈 채 헤드 전부를 가진 것을, 헤드를 나눈 채 시퀀스 전부를 가진 것으로 바꾸면 "
             "각 랭크는 보통의 어텐션을 돌릴 수 있습니다.",
             "Attention works head by head. Trade 'part of the sequence, every head' for 'the whole sequence, part of the "
             "heads' and each rank can run ordinary attention."),
        Text("앞: 헤드를 N묶음으로 잘라 묶음 j를 랭크 j에, 받은 시퀀스 블록을 랭크 순서로 이어 붙입니다. 뒤: 시퀀스를 N블록으로 잘라 블록 j를 "
             "랭크 j에, 받은 헤드 묶음을 랭크 순서로 이어 붙입니다. all-to-all 하나는 (N-1)/N·L을 보냅니다.",
             "Before: cut the heads into N groups, group j to rank j, and join the received sequence blocks in rank "
             "order. After: cut the sequence into N blocks, block j to rank j, and join the received head groups in "
             "rank order. One all-to-all sends (N-1)/N·L."),
        Text("exchange(x, scatter_dim, gather_dim) 하나를 쓰세요: x를 scatter_dim에서 N블록으로 잘라 맨 앞에 쌓고(블록 j는 랭크 j "
             "몫), all_to_all_single, 받은 블록들을 gather_dim으로 랭크 순서대로 이어 붙입니다. 그것을 감싼 autograd Function의 "
             "backward는 두 차원을 바꾼 exchange입니다. 어텐션 앞은 (헤드, 시퀀스), 뒤는 (시퀀스, 헤드).",
             "Write one exchange(x, scatter_dim, gather_dim): cut x into N blocks along scatter_dim and stack them in front "
             "(block j for rank j), all_to_all_single, and join the received blocks along gather_dim in rank order. An "
             "autograd Function around it has for backward the exchange with the two dimensions swapped. Before attention "
             "(heads, sequence); after it (sequence, heads).")),
    [Case(Text("2 랭크, H=2, s=6", "2 ranks, H=2, s=6"), 2, {"seed": 131, "shape": (1, 2, 6, 4)}),
     Case(Text("3 랭크, H=3, s=6, d=5, b=2", "3 ranks, H=3, s=6, d=5, b=2"), 3, {"seed": 132, "shape": (2, 3, 6, 5)}),
     Case(Text("4 랭크, H=8(랭크마다 헤드 2개), s=8", "4 ranks, H=8 (2 heads per rank), s=8"), 4,
          {"seed": 133, "shape": (1, 8, 8, 3)})],
    _judge_ulysses, crash_hints=(("does not require grad", NOT_DIFFERENTIABLE), ("returned an invalid gradient", BACKWARD_SWAP),
                                 (", in backward\n", BACKWARD_SWAP)))

EXERCISES = [RING, ULYSSES]
