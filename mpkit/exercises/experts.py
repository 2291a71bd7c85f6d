"""Lab 11 exercise: an expert-parallel mixture-of-experts layer with a capacity — dispatch and
combine with all-to-all, dropped tokens, and the 1/N on expert gradients.

Each rank holds E/N experts (rank r: experts r·E/N ..), the router (the same on every rank) and one
sequence of tokens. The learner's layer routes its tokens (top-k of the router's softmax), drops
what is over an expert's capacity exactly as ``mpkit.models.MixtureOfExperts`` does (slots handed
out to every token's first choice in token order, then to second choices, ...), sends the
[E, capacity, h] buffer to the experts' ranks with one all-to-all, runs its experts, sends the
results back with another and combines them weighted by the router's probabilities. After the
backward of the mean loss over its own tokens, ``synchronize_gradients`` divides the expert
gradients by N (the all-to-all's backward brought every rank's tokens' gradient: N times that of
the global mean) and averages the router's over the ranks, as data parallelism does.

Checked against ``MixtureOfExperts`` on one device over every rank's sequence (one group each, so
the capacity applies per rank): the output, every expert's gradient and the router's. Cost: two
all-to-alls per forward and two per backward, each (N-1)/N of the E·capacity·h buffer, and in the
synchronisation only the router's all-reduce (the 1/N needs no message).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mpkit.exercises import harness
from mpkit.exercises.common import Case, Exercise, close, failed, mismatch, passed, ratio, seeded
from mpkit.exercises.phase_bytes import missed, over_target
from mpkit.exercises.result import Text
from mpkit.models import MixtureOfExperts

HIDDEN = 6
ALL_TO_ALL = ("all_to_all", "all_to_all_single")


def _moe(seed, spec, capacity_factor=None):
    torch.manual_seed(seed)
    return MixtureOfExperts(HIDDEN, spec["experts"], spec["top_k"], capacity_factor or spec["capacity_factor"])


def _data(seed, n, tokens):
    g = seeded(seed + 1)
    return torch.randn(n, tokens, HIDDEN, generator=g), torch.randn(n, tokens, HIDDEN, generator=g)


def _mine(rank, n, experts):
    per = experts // n
    return range(rank * per, (rank + 1) * per)


def _moe_body(ctx, recorder, cls, seed, spec):
    n, r = ctx.world_size, ctx.rank
    moe = _moe(seed, spec)
    x, y = _data(seed, n, spec["tokens"])
    mine = _mine(r, n, spec["experts"])
    experts = nn.ModuleList([moe.experts[e] for e in mine])
    recorder.phase = "setup"
    layer = recorder.call(cls, ctx, moe.router, experts, spec["experts"], spec["top_k"], moe.capacity(spec["tokens"]))
    recorder.phase = "forward"
    out = recorder.call(layer.forward, x[r])
    if not isinstance(out, torch.Tensor) or out.shape != x[r].shape or not out.requires_grad:
        return {"out": out.detach() if isinstance(out, torch.Tensor) else repr(out)[:200], "grads": None}
    loss = F.mse_loss(out, y[r])   # the mean over this rank's tokens
    recorder.phase = "backward"
    recorder.call(loss.backward)
    recorder.phase = "sync"
    recorder.call(layer.synchronize_gradients)
    grads = {"router": moe.router.weight.grad}
    grads |= {f"experts.{e}.{name}": p.grad for e in mine for name, p in moe.experts[e].named_parameters()}
    return {"out": out.detach(), "grads": {k: None if g is None else g.clone() for k, g in grads.items()}}


def _reference(seed, spec, n):
    """The output per rank's sequence and every gradient of the mean loss over all tokens, on one
    device; the router's gradient of one rank's own loss too (what it holds before averaging)."""
    moe = _moe(seed, spec)
    x, y = _data(seed, n, spec["tokens"])
    out = moe(x)
    F.mse_loss(out, y).backward()
    grads = {"router": moe.router.weight.grad.clone()}
    grads |= {f"experts.{e}.{name}": p.grad.clone() for e, expert in enumerate(moe.experts)
              for name, p in expert.named_parameters()}
    return out.detach(), grads, dict(moe.stats)


def _own_router_gradient(seed, spec, n, rank):
    moe = _moe(seed, spec)
    x, y = _data(seed, n, spec["tokens"])
    F.mse_loss(moe(x[rank:rank + 1]), y[rank:rank + 1]).backward()
    return moe.router.weight.grad


DROPLESS = Text("토큰을 버리지 않았습니다: 전문가 하나는 용량(capacity)만큼의 슬롯만 받습니다. 먼저 모든 토큰의 첫 선택을 토큰 순서대로, 그다음 "
                "두 번째 선택을 채우고, 자리가 없는 (토큰, 전문가) 선택은 버립니다(그 몫의 출력은 0, 잔차로만 지나감).",
                "no token was dropped: an expert has only `capacity` slots. Fill them with every token's first choice in "
                "token order, then the second choices, and drop the (token, expert) choices that find no slot (their "
                "share of the output is 0: they pass through the residual only).")
ROUTING = Text("라우팅과 합치기를 확인하세요: 확률 = softmax(router(x)), 전문가 = top-k, 슬롯은 선택 순서(첫 선택 전부, 그다음 둘째)와 토큰 순서로, "
               "출력 = Σ 확률·전문가 출력(다시 정규화하지 않음). all-to-all로 받은 것은 [N(보낸 랭크), E/N(내 전문가), capacity, h]이고, "
               "돌려보낼 때도 같은 배치입니다.",
               "check the routing and the combine: probabilities = softmax(router(x)), experts = top-k, slots by choice "
               "(every first choice, then the second) and token order, output = Σ probability · expert output (not "
               "renormalised). What the all-to-all brings is [N (source rank), E/N (my experts), capacity, h], and it "
               "goes back in the same layout.")
ONE_OVER_N = Text("전문가 그래디언트가 정확히 N배입니다: 1/N을 빠뜨렸습니다. all-to-all의 역전파가 모든 랭크 토큰의 그래디언트를 이 랭크의 전문가에게 "
                  "가져왔고, 각 랭크의 손실은 자기 토큰의 평균이니 그 합은 전체 평균 손실 그래디언트의 N배입니다: 통신 없이 N으로 나누세요.",
                  "the expert gradients are exactly N times too large: the 1/N is missing. The all-to-all's backward "
                  "brought every rank's tokens' gradient to this rank's experts, and each rank's loss is the mean over its "
                  "own tokens, so their sum is N times the gradient of the global mean: divide by N, with no message.")
EXPERTS_REDUCED = Text("전문가 그래디언트를 all-reduce했습니다: 랭크마다 전문가가 다르니 남의 전문가 그래디언트가 더해집니다. 전문가는 이미 모든 토큰의 "
                       "그래디언트를 가졌으니 N으로 나누기만 하세요.",
                       "the expert gradients were all-reduced: every rank holds different experts, so another expert's "
                       "gradient was added in. The experts already hold every token's gradient: only divide by N.")
EXPERT_NONE = Text("전문가의 출력이 손실에 닿지 않았습니다: 합치기는 되돌아온 all-to-all 결과를 써야 하고, all-to-all은 미분되어야 합니다(autograd "
                   "Function, backward는 거꾸로 교환).",
                   "the experts' outputs never reached the loss: the combine must use what the second all-to-all brought "
                   "back, and the all-to-all must be differentiable (an autograd Function whose backward exchanges back).")
ROUTER_OWN = Text("라우터 그래디언트가 이 랭크 토큰의 것뿐입니다: 라우터는 모든 랭크에 같으니 데이터 병렬처럼 all-reduce한 뒤 N으로 나누세요.",
                  "the router's gradient is this rank's tokens' only: the router is the same on every rank, so all-reduce "
                  "it and divide by N, as data parallelism does.")
ROUTER_SUMMED = Text("라우터 그래디언트가 N배입니다: all-reduce로 합한 뒤 N으로 나누지 않았습니다(전문가와 달리 라우터는 평균).",
                     "the router's gradient is N times too large: it was all-reduced and never divided by N (unlike the "
                     "experts, the router is averaged).")
ROUTER_NONE = Text("라우터에 그래디언트가 없습니다: 라우터는 합치기의 가중치(확률)를 통해서만 배웁니다. 전문가 출력에 그 토큰의 확률을 곱하세요.",
                   "the router has no gradient: it learns only through the combine weights. Multiply each expert output "
                   "by its token's probability.")
NOT_DIFFERENTIABLE = Text("forward의 출력이 그래프에 이어지지 않았습니다: dist.all_to_all_single은 미분되지 않으니 autograd Function으로 감싸세요"
                          "(backward는 같은 크기로 거꾸로 교환).",
                          "forward's output is not connected to the graph: dist.all_to_all_single is not differentiable; wrap "
                          "it in an autograd Function (its backward exchanges back, same sizes).")


def _expert_hint(name, want, have, n, spec, grads, rank):
    """Why an expert's gradient is off: the missing 1/N, or experts all-reduced across ranks."""
    factor = ratio(want, have)
    if factor is not None and abs(factor - n) <= 1e-3 * n:
        return ONE_OVER_N
    e, rest = int(name.split(".")[1]), name.split(".", 2)[2]
    local = e - _mine(rank, n, spec["experts"]).start
    mixed = sum(grads[f"experts.{_mine(other, n, spec['experts'])[local]}.{rest}"] for other in range(n))
    if close(mixed, have) or close(mixed * n, have):
        return EXPERTS_REDUCED
    return ROUTING


def _router_hint(want, have, seed, spec, n, rank):
    factor = ratio(want, have)
    if factor is not None and abs(factor - n) <= 1e-3 * n:
        return ROUTER_SUMMED
    own = _own_router_gradient(seed, spec, n, rank)
    return ROUTER_OWN if close(own, have) or close(own / n, have) else ROUTING


def _values(case, outputs, seed, spec, n, reference):
    out, grads, _ = reference
    for rank, output in enumerate(outputs):
        got = output["out"]
        if not close(out[rank], got["out"]):
            hint = ROUTING
            if isinstance(got["out"], torch.Tensor) and got["out"].shape == out[rank].shape:
                dropless = _moe(seed, spec, capacity_factor=spec["experts"] / spec["top_k"])(_data(seed, n, spec["tokens"])[0])
                hint = DROPLESS if close(dropless[rank].detach(), got["out"]) else ROUTING
            return failed(case, mismatch(Text(f"랭크 {rank}, 출력:", f"rank {rank}, the output:"), out[rank], got["out"]), hint)
        if got["grads"] is None:
            return failed(case, Text(f"랭크 {rank}: forward의 출력을 미분할 수 없습니다.", f"rank {rank}: forward's output has no "
                                     "gradient."), NOT_DIFFERENTIABLE)
        for name, have in got["grads"].items():
            want = grads[name]
            where = Text(f"랭크 {rank}, '{name}'의 그래디언트:", f"rank {rank}, the gradient of '{name}':")
            if have is None:
                return failed(case, where + Text("None입니다.", "it is None."),
                              ROUTER_NONE if name == "router" else EXPERT_NONE)
            if not close(want, have):
                hint = _router_hint(want, have, seed, spec, n, rank) if name == "router" else \
                    _expert_hint(name, want, have, n, spec, grads, rank)
                return failed(case, mismatch(where, want, have), hint)
    return None


TWO_ALL_TO_ALLS = Text("방향마다 all-to-all 두 번이면 됩니다: dispatch는 [E, capacity, h] 버퍼 전체를 한 번에(차원 0을 N개로: 랭크 j의 전문가들), "
                       "combine도 한 번에. 전문가마다 따로 보내면 메시지 수(지연 α)가 늘고, all-gather는 N배를 보냅니다.",
                       "two all-to-alls per direction are enough: dispatch sends the whole [E, capacity, h] buffer at once "
                       "(dimension 0 cut in N: rank j's experts), combine likewise. One exchange per expert multiplies the "
                       "messages (latency α), and an all-gather sends N times the bytes.")
SYNC_BYTES = Text("동기화에서 보낼 것은 라우터 그래디언트의 all-reduce 하나뿐입니다: 전문가의 1/N은 통신이 필요 없습니다.",
                  "the synchronisation sends only the router gradient's all-reduce: the experts' 1/N needs no message.")


def _cost(case, outputs, n, spec, capacity):
    buffer = spec["experts"] * capacity * HIDDEN * 4
    exchange = 2 * (n - 1) * buffer // n
    found = over_target(outputs, n, exchange, counted=ALL_TO_ALL, most=2)
    if found is not None:
        return missed(case, found, exchange, Text(
            f"all-to-all 두 번(dispatch, combine), 2·(N-1)/N·E·capacity·h·4 (버퍼 {buffer} B)",
            f"two all-to-alls (dispatch, combine), 2·(N-1)/N·E·capacity·h·4 (the buffer: {buffer} B)"), TWO_ALL_TO_ALLS)
    router = 2 * (n - 1) * spec["experts"] * HIDDEN * 4 // n
    found = over_target(outputs, n, router, phases=("sync",))
    if found is not None:
        return missed(case, found, router, Text("라우터 그래디언트의 all-reduce", "the router gradient's all-reduce"),
                      SYNC_BYTES)
    return None

def _judge(case, cls, timeout):
    n, seed, spec = case.world_size, case.params["seed"], case.params
    outputs = harness.run(_moe_body, n, (cls, seed, spec), timeout)
    reference = _reference(seed, spec, n)
    stats = reference[2]
    problem = _values(case, outputs, seed, spec, n, reference) or _cost(case, outputs, n, spec, stats["capacity"])
    if problem:
        return problem
    choices = n * spec["tokens"] * spec["top_k"]
    return passed(case, Text(f"(토큰, 전문가) 선택 {choices}개 중 {stats['dropped']}개 버림; 방향마다 all-to-all 두 번",
                             f"{stats['dropped']} of {choices} (token, expert) choices dropped; two all-to-alls per direction"))


STUB = '''class ExpertParallelMoE:
    """전문가 병렬화(expert parallelism): 전문가 E개 중 이 랭크의 E/N개(랭크 r: 전문가 r·E/N ..)를 가진 MoE 레이어,
    ExpertParallelMoE(ctx, router, experts, num_experts, top_k, capacity). router: nn.Linear(h, E)(모든 랭크에 같음),
    experts: 이 랭크 전문가들의 nn.ModuleList, capacity: 전문가 하나가 받는 슬롯 수.
    forward(x): 이 랭크의 토큰 x [t, h]를 라우팅(확률 = softmax(router(x)), 전문가 = top_k), 용량을 넘는 선택은 버리고
    (슬롯은 모든 토큰의 첫 선택을 토큰 순서대로, 그다음 두 번째 선택 — mpkit.models.MixtureOfExperts와 같이), [E, capacity, h]
    버퍼를 all-to-all로 전문가의 랭크에 보내 계산하고 all-to-all로 되돌려, 출력 [t, h] = Σ 확률·전문가 출력(버린 선택은 0).
    synchronize_gradients(): 각 랭크의 손실(자기 토큰의 평균)로 역전파한 뒤, 그래디언트를 전체 평균 손실의 것으로 맞춥니다.
    비용 목표: 순전파와 역전파 각각 all-to-all 두 번, 랭크마다 2·(N-1)/N·E·capacity·h·4 바이트 이하; 동기화는 라우터 그래디언트의
    all-reduce 하나.
    Expert parallelism: an MoE layer holding this rank's E/N of the E experts (rank r: experts r·E/N ..),
    ExpertParallelMoE(ctx, router, experts, num_experts, top_k, capacity). router:
    nn.Linear(h, E), the same on every rank; experts: an nn.ModuleList of this rank's experts; capacity: the slots
    of one expert. forward(x): route this rank's tokens x [t, h] (probabilities = softmax(router(x)), experts =
    top_k), drop the choices over capacity (slots go to every token's first choice in token order, then the second
    choices — as mpkit.models.MixtureOfExperts does), send the [E, capacity, h] buffer to the experts' ranks with
    an all-to-all, compute, all-to-all back, and return [t, h] = Σ probability · expert output (0 for a dropped
    choice). synchronize_gradients(): after each rank's backward of its own loss (the mean over its tokens), make
    the gradients those of the global mean loss.
    Cost target: two all-to-alls in the forward and two in the backward, at most 2·(N-1)/N·E·capacity·h·4 bytes per
    rank each way; the synchronisation sends one all-reduce of the router's gradient."""

    def __init__(self, ctx, router, experts, num_experts, top_k, capacity):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")

    def forward(self, x):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")

    def synchronize_gradients(self):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

EXERCISES = [
    Exercise("expert_parallel_moe", "11", Text("전문가 병렬 MoE: 용량, dispatch와 combine, 전문가 그래디언트의 1/N",
                                               "Expert-parallel MoE: capacity, dispatch and combine, the 1/N on expert gradients"),
             STUB, (
        Text("토큰은 전문가가 있는 랭크로 가서 계산되고 돌아옵니다: 고정 크기 버퍼 [E, capacity, h]를 만들면 all-to-all 한 번이 각 랭크에 자기 "
             "전문가의 몫을 나눠 줍니다. 전문가는 모든 랭크의 토큰을 보므로 그 그래디언트는 모든 랭크 손실의 합입니다.",
             "Tokens travel to their experts' ranks and back: with a fixed [E, capacity, h] buffer one all-to-all hands "
             "every rank its experts' share. An expert sees every rank's tokens, so its gradient is the sum over every "
             "rank's loss."),
        Text("슬롯: 선택 순서로 늘어놓은 (토큰, 전문가) 목록에서 전문가별 누적 개수 − 1, capacity 이상이면 버림. 받은 것: [N, E/N, capacity, h]. "
             "전체 손실 L = (1/N)·Σ_r L_r이니 전문가 그래디언트 ÷ N, 라우터는 all-reduce ÷ N.",
             "Slot: in the (token, expert) list in choice order, the running count per expert − 1; dropped when >= "
             "capacity. What arrives: [N, E/N, capacity, h]. The global loss L = (1/N)·Σ_r L_r, so expert gradients ÷ N, "
             "the router's all-reduced ÷ N."),
        Text("(토큰, 선택) 쌍을 선택 우선으로 늘어놓고, 전문가별 누적 개수(one_hot(...).cumsum)로 각 쌍의 슬롯을 정해 slot < capacity만 "
             "남깁니다. 남은 토큰을 0으로 채운 버퍼 [E, capacity, h]에 흩어 넣고(index_put은 autograd가 따라갑니다), 미분되는 all-to-all로 "
             "보내고, 받은 [N, E/N, capacity, h]에서 내 전문가 j는 [:, j]를 계산, 되돌려 받은 출력에 확률을 곱해 index_add로 토큰에 "
             "더합니다.",
             "List the (token, choice) pairs choice-major; a running count per expert (one_hot(...).cumsum) gives each its "
             "slot, and only slot < capacity stays. Scatter the kept tokens into a zero buffer [E, capacity, h] (index_put "
             "keeps autograd), send it through a differentiable all-to-all, let my expert j compute [:, j] of what arrives "
             "as [N, E/N, capacity, h], and index_add the returned outputs, times their probabilities, to their tokens.")),
        [Case(Text("2 랭크, 전문가 4개, top-1, 용량 계수 1.0(버려지는 토큰)", "2 ranks, 4 experts, top-1, capacity factor 1.0 "
                   "(tokens dropped)"), 2, {"seed": 141, "experts": 4, "top_k": 1, "capacity_factor": 1.0, "tokens": 6}),
         Case(Text("4 랭크, 전문가 4개(랭크마다 1개), top-2, 용량 계수 1.0", "4 ranks, 4 experts (one per rank), top-2, capacity "
                   "factor 1.0"), 4, {"seed": 147, "experts": 4, "top_k": 2, "capacity_factor": 1.0, "tokens": 5}),
         Case(Text("3 랭크, 전문가 6개, top-1, 토큰 7개", "3 ranks, 6 experts, top-1, 7 tokens"), 3,
              {"seed": 143, "experts": 6, "top_k": 1, "capacity_factor": 1.0, "tokens": 7})],
        _judge, uses="class", crash_hints=(("does not require grad", NOT_DIFFERENTIABLE),), target="ExpertParallelMoE"),
]
