"""Lab 05 exercise: an all-reduce that is not lab 05's ring, recursive halving-doubling
(Rabenseifner's algorithm), from point-to-point messages only, graded on its alpha-beta cost.

In round k of the reduce-scatter each rank exchanges half of the range it still sums with rank
``r XOR d`` (d = N/2, N/4, ..., 1) and keeps the other half; the all-gather runs the same pairs
backwards (d = 1, 2, ..., N/2), each round doubling the complete range. Same bytes as the ring,
2(N-1)/N·S per rank, in 2·log2 N rounds instead of 2(N-1): cost α·2·log2 N + β·2(N-1)/N·S.
The checker accepts any correct code with that cost: values (in place), messages only, at most
2·log2 N messages sent per rank and at most the bytes above (in whole chunks of ceil(S/N) for
sizes that do not divide evenly); for a world size that is not a power of two the function must raise
``ValueError`` before sending anything.
"""
from __future__ import annotations

import torch

from mpkit.errors import LaunchError
from mpkit.exercises import harness
from mpkit.exercises.collectives import SELF_SEND, _body, _expected, _inputs
from mpkit.exercises.common import Case, Exercise, close, factor_hint, failed, mismatch, passed, ratio
from mpkit.exercises.result import Text


def _rounds(n) -> int:
    return 2 * (n.bit_length() - 1)


def _refusal_body(ctx, recorder, fn, shape, seed):
    try:
        recorder.call(fn, ctx, _inputs(ctx.rank, shape, seed))
    except ValueError as err:
        return {"refused": str(err) or "ValueError"}
    return {"refused": None}


POWER_OF_TWO = Text("반씩 나누기(halving)는 랭크를 둘씩 짝지으므로 N이 2의 거듭제곱이어야 합니다: 통신하기 전에 N을 확인하고 "
                    "ValueError로 거절하세요(예: N & (N-1) != 0).",
                    "halving pairs the ranks up, so N must be a power of two: check N before any message and refuse "
                    "with ValueError (e.g. N & (N-1) != 0).")


SIZES_DIFFER = Text("gloo는 받는 쪽이 건 크기와 다른 메시지가 오면 프로세스를 멈춥니다: 두 짝이 같은 범위를 같은 점에서 나누고(예: "
                    "mid = (lo+hi)//2, 작은 랭크가 앞 절반), 한쪽이 보내는 절반의 크기가 다른 쪽이 받는 크기와 같은지 보세요.",
                    "gloo aborts a process when a message's size differs from what its receiver posted: both partners "
                    "must split the same range at the same point (e.g. mid = (lo+hi)//2, the lower rank keeping the "
                    "front half), so the half one sends is the size the other receives.")


def _judge_refusal(case, fn, timeout):
    try:
        outputs = harness.run(_refusal_body, case.world_size, (fn, case.params["shape"], 0), timeout)
    except harness.LearnerCrashed as crash:
        return failed(case, Text(f"랭크 {crash.rank}에서 ValueError가 아닌 예외가 났습니다:\n{crash.text}",
                                 f"rank {crash.rank} raised something other than ValueError:\n{crash.text}"), POWER_OF_TWO)
    except LaunchError as err:  # a message to a rank that does not exist can kill the process
        return failed(case, Text(f"거절하지 않고 통신하다가 {err.summary}", f"it communicated instead of refusing: {err.summary}"),
                      POWER_OF_TWO)
    except harness.Stuck as stuck:  # ... or wait for ever
        return failed(case, Text(f"거절하지 않고 통신하다가 멈췄습니다. {stuck.describe()}",
                                 f"it communicated instead of refusing and got stuck. {stuck.describe()}"), POWER_OF_TWO)
    for rank, output in enumerate(outputs):
        sent = [c for c in output["calls"] if c.kind != "recv"]
        if output["out"]["refused"] is None or sent:
            what = (Text("거절하지 않았습니다.", "it did not refuse.") if output["out"]["refused"] is None else
                    Text(f"거절하기 전에 {sent[0].describe()}을(를) 했습니다.", f"it made {sent[0].describe()} before refusing."))
            return failed(case, Text(f"랭크 {rank}: N={case.world_size}은 2의 거듭제곱이 아닌데", f"rank {rank}: N={case.world_size} "
                                     "is not a power of two, but") + what, POWER_OF_TWO)
    return passed(case, Text(f"거절: {outputs[0]['out']['refused']}", f"refused: {outputs[0]['out']['refused']}"))


def _cost_problem(case, outputs, n, numel, element_size):
    rounds = _rounds(n)
    limit = 2 * (n - 1) * -(-numel // n) * element_size  # 2(N-1)/N·S, in whole chunks of ceil(S/N)
    for rank, output in enumerate(outputs):
        calls = output["calls"]
        collectives = sorted({c.kind for c in calls if c.kind not in ("send", "recv")})
        if collectives:
            return failed(case, Text(f"랭크 {rank}이(가) {', '.join(collectives)}을(를) 불렀습니다.",
                                     f"rank {rank} called {', '.join(collectives)}."),
                          Text("이 연습은 집합 통신을 직접 만드는 것입니다: send/recv(또는 isend/irecv)만 쓰세요.",
                               "this exercise builds the collective itself: use only send/recv (or isend/irecv)."))
        sends = sum(1 for c in calls if c.kind == "send" and c.numel)
        sent = sum(c.nbytes for c in calls if c.kind == "send")
        cost = Text(f"랭크 {rank}: 메시지 {sends}번, {sent} B. 목표: {rounds}번(2·log2 N), 최대 {limit} B(2(N-1)/N·S), "
                    f"곧 α·{rounds} + β·{limit} B.",
                    f"rank {rank}: {sends} messages, {sent} B; target: {rounds} messages (2·log2 N) and at most {limit} B "
                    f"(2(N-1)/N·S), i.e. α·{rounds} + β·{limit} B.")
        if sends > rounds:
            return failed(case, cost, Text(f"링은 2(N-1) = {2 * (n - 1)}번 보냅니다(α가 N에 비례). 반씩 나누기는 라운드마다 짝 "
                                           "r XOR d와 한 번만 주고받습니다: d = N/2, N/4, ..., 1, 다음에 1, 2, ..., N/2.",
                                           f"the ring sends 2(N-1) = {2 * (n - 1)} messages (α grows with N). "
                                           "Halving-doubling exchanges once per round with partner r XOR d: d = N/2, "
                                           "N/4, ..., 1, then 1, 2, ..., N/2."))
        if sent > limit:
            return failed(case, cost, Text("라운드마다 텐서 전체를 보냈습니다(재귀적 두 배 all-reduce: β·log2 N·S). 반씩 나누기에서는 "
                                           "짝에게 넘기는 절반만 보내고, 모으기에서는 완성된 부분만 보내세요.",
                                           "whole tensors went out in some round (recursive-doubling all-reduce: "
                                           "β·log2 N·S). In the halving, send only the half you give away; in the "
                                           "doubling, only the part that is complete."))
    return None


def _order_hint(n, calls):
    """The doubling run with the halving's partner order (d = N/2 first) instead of in reverse."""
    peers = [c.peer for c in calls if c.kind == "send" and c.numel]
    rounds = n.bit_length() - 1
    if n >= 4 and len(peers) == 2 * rounds and peers[rounds:] == peers[:rounds]:
        return Text("모으기(doubling)가 반씩 나누기와 같은 순서로 짝을 돕니다: 거꾸로(d = 1, 2, ..., N/2) 돌아야 각 라운드에 "
                    "완성된 범위를 짝과 맞바꿉니다.",
                    "the doubling visits the partners in the halving's order: it must run them in reverse order (d = 1, "
                    "2, ..., N/2) so that each round swaps a complete range with the partner.")
    return None


def _value_hint(n, rank, expected, got):
    hint = factor_hint(ratio(expected, got), n, "sum")
    if hint is not None or not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return hint
    right = torch.isclose(got.reshape(-1).double(), expected.reshape(-1).double(), rtol=1e-4, atol=1e-5)
    if 0 < int(right.sum()) <= -(-expected.numel() // n):
        return Text(f"랭크 {rank}은(는) 자기 몫(약 S/N)만 완성된 합입니다: reduce-scatter(반씩 나누기) 뒤의 all-gather(두 배로 "
                    "모으기)가 없거나, 받은 부분을 제자리에 두지 않았습니다.",
                    f"rank {rank} holds the complete sum in its own piece (about S/N) only: the all-gather (doubling) after "
                    "the reduce-scatter (halving) is missing, or what arrived was not put in place.")
    return Text("어떤 부분의 합이 틀렸습니다: 두 짝이 같은 범위를 같은 경계에서 나누는지(작은 랭크가 앞 절반을 갖는 식으로), 받은 절반을 "
                "자기가 가진 절반에 더하는지 확인하세요.",
                "some part's sum is wrong: check that both partners split the same range at the same point (the lower "
                "rank keeping the first half, say) and that the half you receive is added into the half you keep.")


def _judge(case, fn, timeout):
    if case.params.get("refuse"):
        return _judge_refusal(case, fn, timeout)
    n, shape, seed = case.world_size, case.params["shape"], case.params["seed"]
    try:
        outputs = [o["out"] | {"calls": o["calls"]} for o in harness.run(_body, n, (fn, shape, seed), timeout)]
    except LaunchError as err:
        if err.exc_type != "died":
            raise
        return failed(case, Text(f"{err.summary}.", f"{err.summary}."), SIZES_DIFFER)
    except harness.LearnerCrashed as crash:  # a rank whose partner died first sees only the closed connection
        if "by peer" not in crash.text:
            raise
        return failed(case, Text(f"랭크 {crash.rank}의 짝이 먼저 멈췄습니다:\n{crash.text}",
                                 f"rank {crash.rank}'s partner died first:\n{crash.text}"), SIZES_DIFFER)
    for rank, (want, output) in enumerate(zip(_expected("all_reduce", n, shape, seed), outputs)):
        got = output["given"]
        if not close(want, got) and close(want, output["out"]):
            return failed(case, Text(f"랭크 {rank}: 돌려준 텐서는 맞지만 tensor 자체는 바뀌지 않았습니다.",
                                     f"rank {rank}: the returned tensor is right, but tensor itself was not changed."),
                          Text("all-reduce는 제자리에서(in place) 합합니다: tensor.view(-1)의 조각(view)에 더하고 복사하세요.",
                               "all-reduce works in place: add and copy into slices (views) of tensor.view(-1)."))
        if not close(want, got):
            return failed(case, mismatch(Text(f"랭크 {rank}, tensor:", f"rank {rank}, tensor:"), want, got),
                          _order_hint(n, output["calls"]) or _value_hint(n, rank, want, got))
    problem = _cost_problem(case, outputs, n, torch.Size(shape).numel(), 4)
    if problem:
        return problem
    sends = max(sum(1 for c in o["calls"] if c.kind == "send" and c.numel) for o in outputs)
    sent = max(sum(c.nbytes for c in o["calls"] if c.kind == "send") for o in outputs)
    return passed(case, Text(f"랭크당 최대 메시지 {sends}번, {sent} B", f"at most {sends} messages and {sent} B per rank"))


STUB = '''def halving_doubling_all_reduce(ctx, tensor):
    """tensor를 모든 랭크에 걸쳐 제자리에서(in place) 합하고 tensor를 돌려줍니다. 재귀적 반씩 나누기-두 배로 모으기(Rabenseifner):
    reduce-scatter는 라운드마다 짝(r XOR d, d = N/2, N/4, ..., 1)에게 지금 범위의 절반을 주고 나머지 절반을 더해 가지며,
    all-gather는 같은 짝들과 거꾸로(d = 1, 2, ..., N/2) 완성된 범위를 두 배로 넓힙니다. 점대점(send/recv, isend/irecv)만.
    N이 2의 거듭제곱이 아니면 아무것도 보내기 전에 ValueError로 거절하세요. 크기는 N으로 나누어떨어지지 않을 수 있습니다.
    비용 목표(α-β): 랭크마다 2·log2 N번 메시지, 2(N-1)/N·S 바이트 -> α·2·log2 N + β·2(N-1)/N·S (링: α·2(N-1) + 같은 β 항).
    Sum tensor over all ranks in place and return it, by recursive halving-doubling (Rabenseifner): the
    reduce-scatter gives half of the current range to partner r XOR d (d = N/2, N/4, ..., 1) each round and adds
    the other half in; the all-gather runs the same partners backwards (d = 1, 2, ..., N/2), doubling the complete
    range. Point-to-point messages only. When N is not a power of two, raise ValueError before sending anything.
    Sizes may not divide evenly. Cost target (alpha-beta): 2·log2 N messages and 2(N-1)/N·S bytes per rank ->
    α·2·log2 N + β·2(N-1)/N·S (the ring: α·2(N-1) + the same β term)."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

EXERCISES = [
    Exercise("halving_doubling_all_reduce", "05", Text("반씩 나누기-두 배로 모으기 all-reduce", "Halving-doubling all-reduce"), STUB, (
        Text("링은 2(N-1)번 메시지를 보내므로 작은 텐서에서는 지연 시간(α)이 지배합니다. 짝을 바꿔 가며 범위를 반씩 줄이면 log2 N번이면 "
             "됩니다.",
             "The ring sends 2(N-1) messages, so latency (α) dominates small tensors. Halving the range with a new partner "
             "each round needs only log2 N rounds per phase."),
        Text("반씩 나누기 k번째 라운드: 짝 = r XOR d(d = N/2^(k+1)), 범위 [lo, hi)를 mid = (lo+hi)//2에서 나눠 작은 랭크는 앞, 큰 "
             "랭크는 뒤 절반을 가집니다. 보내는 양은 S/2 + S/4 + ... = (N-1)/N·S. 모으기는 그 라운드들을 거꾸로 되돌립니다.",
             "Halving round k: partner = r XOR d (d = N/2^(k+1)); split the range [lo, hi) at mid = (lo+hi)//2, the lower "
             "rank keeps the front half, the higher the back. Bytes: S/2 + S/4 + ... = (N-1)/N·S. The doubling undoes "
             "those rounds in reverse."),
        Text("flat = tensor.view(-1). 나누기마다 (lo, hi)를 목록에 기억해 두고, 모으기에서는 그 목록을 거꾸로 읽으며 내 범위를 "
             "보내고 짝의 범위를 받아 [lo, hi)로 넓히세요. 각 교환은 isend와 irecv를 건 뒤 둘 다 wait().",
             "flat = tensor.view(-1). Remember each halving's (lo, hi) in a list; in the doubling read it backwards, "
             "send your range, receive the partner's and widen to [lo, hi). Each exchange: post isend and irecv, then "
             "wait() on both.")),
        [Case(Text("2 랭크, 모양 (8,)", "2 ranks, shape (8,)"), 2, {"shape": (8,), "seed": 61}),
         Case(Text("4 랭크, 모양 (10,)(나누어떨어지지 않음)", "4 ranks, shape (10,) (uneven)"), 4, {"shape": (10,), "seed": 62}),
         Case(Text("4 랭크, 모양 (2, 3)", "4 ranks, shape (2, 3)"), 4, {"shape": (2, 3), "seed": 63}),
         Case(Text("8 랭크, 모양 (13,)", "8 ranks, shape (13,)"), 8, {"shape": (13,), "seed": 64}),
         Case(Text("3 랭크: 2의 거듭제곱이 아님(ValueError)", "3 ranks: not a power of two (ValueError)"), 3,
              {"shape": (6,), "refuse": True})],
        _judge, crash_hints=(SELF_SEND,)),
]
