"""Lab 05 exercises: the ring's two phases and the ring all-reduce, from send/recv only.

The checker accepts any correct ring: either direction, any order of posting, blocking or not.
It checks what the ranks hold at the end, that only point-to-point messages were used, that each
rank talked only to its two neighbours, and that no rank sent more than the ring's bytes
((N-1) chunks per phase).
"""
from __future__ import annotations

import itertools

import torch

from mpkit.exercises import harness
from mpkit.exercises.common import Case, Exercise, close, factor_hint, failed, mismatch, passed, ratio, seeded
from mpkit.exercises.result import Text


def _inputs(rank, shape, seed):
    return torch.randn(shape, generator=seeded(seed + 1000 * rank))


def _body(ctx, recorder, fn, shape, seed):
    """The rank's input (``mine``), what the learner's call left in it (``given``) and returned (``out``)."""
    mine = _inputs(ctx.rank, shape, seed)
    given = mine.clone()
    out = recorder.call(fn, ctx, given)
    return {"out": out.detach().clone() if isinstance(out, torch.Tensor) else out, "given": given, "mine": mine}


def _expected(kind, n, shape, seed):
    everyone = [_inputs(r, shape, seed) for r in range(n)]
    if kind == "all_gather":
        return [torch.cat([t.reshape(-1) for t in everyone])] * n
    total = torch.stack(everyone).sum(0)
    if kind == "all_reduce":
        return [total] * n
    return [total.reshape(-1).tensor_split(n)[r] for r in range(n)]


def _comm_problems(case, outputs, n):
    """Only messages, only to the two neighbours, at most the ring's bytes."""
    for rank, output in enumerate(outputs):
        collectives = sorted({c.kind for c in output["calls"] if c.kind not in ("send", "recv")})
        if collectives:
            return failed(case, Text(f"랭크 {rank}이(가) {', '.join(collectives)}을(를) 불렀습니다.",
                                     f"rank {rank} called {', '.join(collectives)}."),
                          Text("이 연습은 집합 통신을 직접 만드는 것입니다: send/recv(또는 isend/irecv)만 쓰세요.",
                               "this exercise builds the collective itself: use only send/recv (or isend/irecv)."))
        strangers = sorted({c.peer for c in output["calls"] if c.peer not in ((rank + 1) % n, (rank - 1) % n)})
        if strangers:
            return failed(case, Text(f"랭크 {rank}이(가) 이웃이 아닌 랭크 {strangers}와 통신했습니다.",
                                     f"rank {rank} exchanged messages with rank(s) {strangers}, not its neighbours."),
                          Text("링에서는 랭크 r이 r+1(또는 r-1)에게만 보내고 반대쪽 이웃에게서만 받습니다.",
                               "in a ring, rank r sends only to r+1 (or r-1) and receives only from the other neighbour."))
    return None


def _bytes_problem(case, outputs, n, numel, element_size, phases):
    limit = phases * (n - 1) * -(-numel // n) * element_size
    for rank, output in enumerate(outputs):
        sends = sum(1 for c in output["calls"] if c.kind == "send" and c.numel)
        if sends > phases * (n - 1):
            return failed(case, Text(f"랭크 {rank}이(가) 메시지를 {sends}번 보냈습니다. 링은 단계마다 {n - 1}번입니다.",
                                     f"rank {rank} sent {sends} messages; the ring sends {n - 1} per phase."),
                          Text(f"각 단계는 N-1 = {n - 1}번입니다: N번째 단계는 이미 끝난 청크를 다시 더하거나 보냅니다.",
                               f"each phase takes N-1 = {n - 1} steps: an N-th step adds or sends a finished chunk again."))
        sent = sum(c.nbytes for c in output["calls"] if c.kind == "send")
        if sent > limit:
            return failed(case, Text(f"랭크 {rank}이(가) {sent}바이트를 보냈습니다. 링은 단계(phase)마다 (N-1)/N·S, 모두 최대 "
                                     f"{limit}바이트입니다.", f"rank {rank} sent {sent} bytes; the ring sends (N-1)/N·S "
                                     f"per phase, at most {limit} bytes in all."),
                          Text("한 단계에 텐서 전체가 아니라 청크(chunk) 하나(S/N)만 보내세요: 링이 대역폭에 최적인 이유입니다.",
                               "send one chunk (S/N) per step, not the whole tensor: that is what makes the ring "
                               "bandwidth-optimal."))
    return None


def _terms(inputs, got_chunk, k):
    """The coefficients c (each 0, 1 or 2 per rank) with ``got_chunk`` = sum of c[j] times rank j's
    chunk ``k``, or None when it is no such sum (a buffer overwritten while it was still sent)."""
    pieces = [x.reshape(-1).tensor_split(len(inputs))[k] for x in inputs]
    for c in itertools.product((0, 1, 2), repeat=len(inputs)):
        if close(sum((w * x for w, x in zip(c, pieces)), torch.zeros_like(pieces[0])), got_chunk):
            return c
    return None


def _ring_mistake(inputs, rank, chunk_index, got_chunk) -> Text:
    """Names what went wrong in one chunk from what it holds: a rank's value missing, counted twice,
    replacing the sum, or no sum of the inputs at all."""
    c = _terms(inputs, got_chunk, chunk_index)
    where_ko, where_en = f"랭크 {rank}의 청크 {chunk_index}", f"rank {rank}'s chunk {chunk_index}"
    if c is None:
        return Text(f"{where_ko}는 입력들의 합이 아닙니다: 아직 보내는 중인 버퍼에 받았거나(isend한 청크에 irecv), wait() 전에 "
                    "버퍼를 다시 썼습니다. 받을 때는 따로 만든 버퍼(torch.empty_like)에 받고, 둘 다 wait()한 뒤 더하세요.",
                    f"{where_en} is no sum of the inputs: a message was received into a buffer still being sent (irecv "
                    "into the chunk you isend), or a buffer was reused before wait(). Receive into a buffer of its own "
                    "(torch.empty_like) and add only after both wait()s.")
    if sum(c) == 1:
        whose = (Text("이 랭크 자신의 값 그대로입니다", "still holds this rank's own value") if c[rank] == 1 else
                 Text(f"랭크 {c.index(1)}의 값뿐입니다", f"holds rank {c.index(1)}'s value only"))
        return Text(f"{where_ko}는 {whose.ko}: reduce-scatter에서 받은 값이 쌓이지 않았습니다. 받은 청크를 더하지(+=) 않고 "
                    "덮어썼거나(copy_ 또는 =) 복사본에 더했거나, 단계가 하나 모자라(N-1번이 아니라 N-2번) 끝나지 않은 청크를 "
                    "all-gather가 퍼뜨렸거나, 방금 보낸 청크에 더했습니다.",
                    f"{where_en} {whose.en}: nothing accumulated in the reduce-scatter. A received chunk replaced the "
                    "sum (copy_ or =) instead of being added (+=), or was added into a copy, or the phase stopped a step "
                    "short (N-2 steps instead of N-1) and the all-gather spread unfinished chunks, or it added into the "
                    "chunk it had just sent.")
    twice = [j for j, w in enumerate(c) if w == 2]
    if twice:
        return Text(f"{where_ko}에 랭크 {twice}의 값이 두 번 더해졌습니다: all-gather 단계에서 받은 완성 청크를 복사하지 않고 "
                    "더했거나, 한 단계를 더(N번) 돌았습니다.",
                    f"{where_en} counts rank(s) {twice} twice: the all-gather phase added a finished chunk instead of "
                    "copying it, or a phase ran one step too many (N instead of N-1).")
    missing = [j for j, w in enumerate(c) if w == 0]
    return Text(f"{where_ko}에 랭크 {missing}의 값이 빠졌습니다: 단계가 모자라거나(N-1번이어야 함), k번째 단계에서 보내는 청크와 "
                "더하는 청크의 번호(mod N)가 어긋나 받은 값이 다른 청크에 더해졌습니다.",
                f"{where_en} lacks rank(s) {missing}: a phase ran too few steps (it needs N-1), or the chunk index "
                "sent and the one added into at step k (mod N) do not line up, so a received value went into "
                "another chunk.")


def _gather_hint(n, expected, got) -> Text:
    """An all-gather's pieces: some never arrived (still zero or empty), or all there in another order."""
    want, have = expected.reshape(-1).tensor_split(n), got.reshape(-1).tensor_split(n)
    if all(any(close(w, h) for h in have) for w in want):
        return Text("조각은 모두 왔지만 제자리에 있지 않습니다: 도착한 순서가 아니라 랭크 순서로 놓으세요(랭크 j의 조각은 j번째 "
                    "자리).", "every piece arrived but some are out of place: put them in rank order (rank j's piece at "
                    "position j), not in the order they arrive.")
    lost = [j for j, (w, h) in enumerate(zip(want, have)) if not close(w, h) and not any(close(w, x) for x in have)]
    if lost:
        return Text(f"결과에 랭크 {lost}의 조각이 없습니다: 오지 않았거나(조각이 링을 다 돌려면 N-1 단계가 필요하고, 받은 조각은 다음 "
                    "단계에 그대로 넘깁니다), 다른 조각이 그 자리에 잘못 놓였습니다.",
                    f"the pieces of rank(s) {lost} are missing from the result: they never arrive (a piece needs N-1 "
                    "steps to go around the ring, and each piece received is passed on at the next step), or another "
                    "piece was put out of place, over their slot.")
    return Text("조각이 제자리에 있지 않습니다: 랭크 j의 조각은 결과의 j번째 자리에 가야 합니다. k번째 단계에서 받는 조각의 "
                "원래 랭크를 확인하세요.",
                "a piece is out of place: rank j's piece belongs at position j of the result. Check which rank the "
                "piece you receive at step k came from.")


def _value_hint(kind, n, rank, expected, got, inputs):
    if isinstance(got, torch.Tensor) and got.shape != expected.shape:
        return Text(f"결과의 모양은 {tuple(expected.shape)}이어야 합니다" + (" (1차원으로 펼친 것)." if kind == "all_gather" else "."),
                    f"the result must have shape {tuple(expected.shape)}" +
                    (" (flattened to 1-D)." if kind == "all_gather" else "."))
    factor = factor_hint(ratio(expected, got), n, "sum")
    if factor is not None:
        return factor
    if kind == "all_gather" and isinstance(got, torch.Tensor):
        return _gather_hint(n, expected, got)
    if kind == "reduce_scatter" and isinstance(got, torch.Tensor):
        sizes = [piece.numel() for piece in inputs[0].reshape(-1).tensor_split(n)]
        other = next((k for k in range(n) if k != rank and sizes[k] == got.numel()
                      and _terms(inputs, got.reshape(-1), k) is not None), None)
        if other is not None:
            return Text(f"돌려준 것은 청크 {other}(의 합)입니다: 연습은 청크 ctx.rank({rank})를 원합니다. 단계의 청크 번호가 하나 "
                        "밀려 다른 청크가 완성됩니다: 랭크 r에서 청크 r이 마지막에 완성되도록 번호를 맞추세요.",
                        f"you returned (a sum of) chunk {other}, another chunk: the exercise wants chunk ctx.rank ({rank}). "
                        "The chunk indices of the steps are shifted by one, so another chunk ends complete: line them up "
                        "so that chunk r is the one finished on rank r.")
    if kind == "all_gather" or not isinstance(got, torch.Tensor):
        return Text("조각이 제자리에 있지 않습니다: 랭크 j의 조각은 결과의 j번째 자리에 가야 합니다. k번째 단계에서 받는 조각의 "
                    "원래 랭크를 확인하세요.",
                    "a piece is out of place: rank j's piece belongs at position j of the result. Check which rank the "
                    "piece you receive at step k came from.")
    if kind == "reduce_scatter":
        return _ring_mistake(inputs, rank, rank, got.reshape(-1))
    chunks = list(zip(expected.reshape(-1).tensor_split(n), got.reshape(-1).tensor_split(n)))
    good = [k for k, (e, g) in enumerate(chunks) if close(e, g)]
    bad = next(k for k, (e, g) in enumerate(chunks) if not close(e, g))
    if len(good) == 1 and _terms(inputs, chunks[bad][1], bad) is not None and sum(_terms(inputs, chunks[bad][1], bad)) < n:
        return Text(f"랭크 {rank}은(는) 청크 {good[0]}만 완성된 합입니다: reduce-scatter 뒤의 all-gather 단계가 없거나, 완성된 "
                    "청크부터 보내지 않습니다(k번째 단계에 보내는 청크 번호를 확인하세요).",
                    f"rank {rank} holds the complete sum in chunk {good[0]} only: the all-gather phase after the "
                    "reduce-scatter is missing, or it does not start from the finished chunk (check the chunk index "
                    "it sends at step k).")
    return _ring_mistake(inputs, rank, bad, chunks[bad][1])


def _judge(kind, phases):
    def judge(case, fn, timeout):
        n, shape, seed = case.world_size, case.params["shape"], case.params.get("seed", 0)
        outputs = [o["out"] | {"calls": o["calls"]}
                   for o in harness.run(_body, n, (fn, shape, seed), timeout)]
        problem = _comm_problems(case, outputs, n)
        if problem:
            return problem
        expected = _expected(kind, n, shape, seed)
        for rank, (want, output) in enumerate(zip(expected, outputs)):
            got = output["given"] if kind == "all_reduce" else output["out"]
            if kind == "all_reduce" and not close(want, got) and close(want, output["out"]):
                return failed(case, Text(f"랭크 {rank}: 돌려준 텐서는 맞지만 tensor 자체는 바뀌지 않았습니다.",
                                         f"rank {rank}: the returned tensor is right, but tensor itself was not changed."),
                              Text("all-reduce는 제자리에서(in place) 합합니다: tensor의 청크(view)에 더하고 복사하세요.",
                                   "all-reduce works in place: add and copy into views (chunks) of tensor itself."))
            if kind == "reduce_scatter" and not torch.equal(output["given"], output["mine"]):
                return failed(case, Text(f"랭크 {rank}: 입력 텐서가 바뀌었습니다.", f"rank {rank}: the input tensor was changed."),
                              Text("reduce-scatter는 입력을 그대로 두고 새 텐서를 돌려줍니다: 청크를 나누기 전에 복사(clone)하세요.",
                                   "reduce-scatter leaves its input alone and returns a new tensor: clone before you "
                                   "cut it into chunks."))
            if not close(want, got):
                what_ko = {"all_reduce": "tensor(제자리)", "reduce_scatter": f"청크 {rank}", "all_gather": "모은 텐서"}[kind]
                what_en = {"all_reduce": "tensor (in place)", "reduce_scatter": f"chunk {rank}",
                           "all_gather": "gathered tensor"}[kind]
                inputs = [_inputs(r, shape, seed) for r in range(n)]
                return failed(case, mismatch(Text(f"랭크 {rank}, {what_ko}:", f"rank {rank}, {what_en}:"), want, got),
                              _value_hint(kind, n, rank, want, got, inputs))
        numel = torch.Size(shape).numel() * (n if kind == "all_gather" else 1)
        problem = _bytes_problem(case, outputs, n, numel, 4, phases)
        return problem or passed(case)
    return judge


def _cases(shapes):
    return [Case(Text(f"{n} 랭크, 모양 {tuple(shape)}", f"{n} ranks, shape {tuple(shape)}"), n,
                 {"shape": shape, "seed": i}) for i, (n, shape) in enumerate(shapes)]


SELF_SEND = ("not connected", Text("자기 자신에게 보냈거나 없는 랭크와 통신했습니다: 링의 이웃은 (r+1) % N과 (r-1) % N입니다.",
                                   "a rank messaged itself or a rank that does not exist: the ring's neighbours are "
                                   "(r+1) % N and (r-1) % N."))

HINTS_RS = (
    Text("텐서를 N개 청크로 나누세요(tensor_split). 각 단계에서 이웃에게 청크 하나를 보내고 다른 이웃에게서 하나를 받아 더합니다.",
         "Cut the tensor into N chunks (tensor_split). In each step send one chunk to a neighbour and add the one you "
         "receive from the other neighbour."),
    Text("N-1 단계. k번째 단계에서 랭크 r은 청크 (r-k-1) mod N을 보내고 청크 (r-k-2) mod N에 받은 것을 더합니다. 끝나면 청크 r이 "
         "완성됩니다. 보내는 양: (N-1)/N·S.",
         "N-1 steps. At step k rank r sends chunk (r-k-1) mod N and adds what it receives into chunk (r-k-2) mod N; "
         "at the end chunk r is complete. Bytes sent: (N-1)/N·S."),
    Text("chunks = tensor.clone().reshape(-1).tensor_split(N)\nfor k in range(N-1):\n    send = chunks[(r-k-1)%N]; "
         "recv_into = chunks[(r-k-2)%N]\n    buf = torch.empty_like(recv_into)\n    isend(send, r+1); irecv(buf, r-1); "
         "둘 다 wait()\n    recv_into += buf\nreturn chunks[r].clone()",
         "chunks = tensor.clone().reshape(-1).tensor_split(N)\nfor k in range(N-1):\n    send = chunks[(r-k-1)%N]; "
         "recv_into = chunks[(r-k-2)%N]\n    buf = torch.empty_like(recv_into)\n    isend(send, r+1); irecv(buf, r-1); "
         "wait() on both\n    recv_into += buf\nreturn chunks[r].clone()"),
)
HINTS_AG = (
    Text("결과 버퍼를 만들어 자기 조각을 자기 자리에 넣고, 받은 조각을 그대로 다음 이웃에게 넘기세요.",
         "Make the result buffer, put your piece in your slot, and pass on each piece you receive to the next neighbour."),
    Text("N-1 단계. k번째 단계에서 랭크 r은 조각 (r-k) mod N을 보내고 조각 (r-k-1) mod N을 받습니다. 보내는 양: (N-1)/N·S.",
         "N-1 steps. At step k rank r sends piece (r-k) mod N and receives piece (r-k-1) mod N. Bytes sent: (N-1)/N·S."),
    Text("out = torch.empty(N*piece.numel()); slots = out.split(piece.numel()); slots[r].copy_(piece.reshape(-1))\n"
         "for k in range(N-1): isend(slots[(r-k)%N], r+1); irecv(slots[(r-k-1)%N], r-1); 둘 다 wait()",
         "out = torch.empty(N*piece.numel()); slots = out.split(piece.numel()); slots[r].copy_(piece.reshape(-1))\n"
         "for k in range(N-1): isend(slots[(r-k)%N], r+1); irecv(slots[(r-k-1)%N], r-1); wait() on both"),
)
HINTS_AR = (
    Text("링 all-reduce = reduce-scatter 다음 all-gather. 두 단계 모두 같은 청크들을 제자리에서(in place) 씁니다.",
         "Ring all-reduce = reduce-scatter, then all-gather, both working in place on the same chunks."),
    Text("2(N-1) 단계. reduce-scatter 뒤 랭크 r은 청크 (r+1) 또는 r(방향에 따라)을 완성합니다. all-gather는 완성된 청크부터 "
         "보냅니다. 랭크당 보내는 양: 2(N-1)/N·S.",
         "2(N-1) steps. After the reduce-scatter rank r holds one complete chunk; the all-gather starts by sending that "
         "one. Bytes per rank: 2(N-1)/N·S."),
    Text("chunks = tensor.view(-1).tensor_split(N)\n# 1단계: k번째에 청크 (r-k) 보내고 (r-k-1)에 더하기 → 청크 (r+1) 완성\n"
         "# 2단계: k번째에 청크 (r+1-k) 보내고 (r-k)에 받은 것 복사",
         "chunks = tensor.view(-1).tensor_split(N)\n# phase 1: at step k send chunk (r-k), add into (r-k-1) -> chunk (r+1) done\n"
         "# phase 2: at step k send chunk (r+1-k), copy what arrives into (r-k)"),
)

STUB_RS = '''def ring_reduce_scatter(ctx, tensor):
    """이 랭크의 몫: 모든 랭크의 tensor 합을 N개 청크(tensor.reshape(-1).tensor_split(N))로 나눈 것 중
    청크 ctx.rank를 새 텐서로 돌려줍니다. tensor는 바꾸지 않습니다. send/recv(또는 ctx.comm.isend/irecv)만 쓰세요.
    This rank's piece of the sum over all ranks: chunk ctx.rank of tensor.reshape(-1).tensor_split(N), as a new
    tensor; leave tensor unchanged. Use only point-to-point messages (dist.send/recv/isend/irecv or ctx.comm's)."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''
STUB_AG = '''def ring_all_gather(ctx, piece):
    """모든 랭크의 piece(모두 같은 크기)를 랭크 순서로 이어 붙인 1차원 텐서를 모든 랭크에 돌려줍니다. 링으로만 통신하세요.
    Every rank's piece (all the same size), flattened and concatenated in rank order, on every rank, as a 1-D
    tensor. Use only point-to-point messages around the ring."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''
STUB_AR = '''def ring_all_reduce(ctx, tensor):
    """tensor를 모든 랭크에 걸쳐 제자리에서(in place) 합하고 tensor를 돌려줍니다: reduce-scatter 다음 all-gather, 링으로만.
    Sum tensor over all ranks in place and return it: a reduce-scatter then an all-gather, around the ring,
    with point-to-point messages only."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

EXERCISES = [
    Exercise("ring_reduce_scatter", "05", Text("링 reduce-scatter", "Ring reduce-scatter"), STUB_RS, HINTS_RS,
             _cases([(2, (8,)), (4, (10,)), (3, (2, 5)), (4, (3,))]), _judge("reduce_scatter", 1),
             crash_hints=(SELF_SEND,)),
    Exercise("ring_all_gather", "05", Text("링 all-gather", "Ring all-gather"), STUB_AG, HINTS_AG,
             _cases([(2, (4,)), (4, (3,)), (3, (2, 2))]), _judge("all_gather", 1),
             crash_hints=(SELF_SEND,)),
    Exercise("ring_all_reduce", "05", Text("링 all-reduce", "Ring all-reduce"), STUB_AR, HINTS_AR,
             _cases([(2, (8,)), (4, (10,)), (3, (2, 5)), (4, (3,))]), _judge("all_reduce", 2),
             crash_hints=(SELF_SEND,)),
]
