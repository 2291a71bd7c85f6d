"""Lab 06 exercise: gradient accumulation under data parallelism, with ``no_sync``.

Each rank runs k micro-batches of its share of one global batch through ``ddp`` (mpkit's
``parallel.DataParallel``, whose ``no_sync()`` works as DDP's) and must end with every gradient
equal to one device's gradient of the whole batch, its loss averaged over all its tokens (rows).
The micro-batches hold different numbers of tokens (every rank the same total), so dividing each
micro-batch's mean loss by k (a mean of means) is wrong exactly where it matters.

Cost target: one gradient all-reduce per bucket per step, not one per micro-step: the backward of
every micro-batch but the last runs inside ``ddp.no_sync()`` (a one-element all-reduce, of a
token count say, is not counted). Several steps with ``zero_grad()``'s
defaults; the model has a frozen layer.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mpkit.exercises import harness
from mpkit.exercises.common import OWN_GRADIENT, Case, Exercise, compare_grads, failed, grads, mlp, passed, seeded
from mpkit.exercises.result import Text
from mpkit.parallel.data_parallel import DataParallel

SIZES, LR = (6, 8, 8, 3), 0.1


def _micro_batches(seed, step, counts):
    """Every rank's micro-batches of one step: counts[rank] token counts, all drawn from one batch."""
    g = seeded(seed + 10 * step)
    total = sum(sum(c) for c in counts)
    x, y = torch.randn(total, SIZES[0], generator=g), torch.randint(0, SIZES[-1], (total,), generator=g)
    out, start = [], 0
    for sizes in counts:
        mine = []
        for size in sizes:
            mine.append((x[start:start + size], y[start:start + size]))
            start += size
        out.append(mine)
    return out


def _reference(seed, counts, steps, weigh):
    """Per step, one device's gradients with each micro-batch's mean loss multiplied by
    ``weigh(tokens, tokens of its rank, k)`` and the ranks averaged: the whole batch's per-token
    mean for ``tokens / rank's tokens``; the mistakes' results for other weights."""
    model = mlp(seed, SIZES)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    out = []
    for step in range(steps):
        opt.zero_grad()
        for mine in _micro_batches(seed, step, counts):
            total = sum(len(y) for _, y in mine)
            for x, y in mine:
                (F.cross_entropy(model(x), y) * weigh(len(y), total, len(mine)) / len(counts)).backward()
        out.append(grads(model))
        opt.step()
    return out


def _body(ctx, recorder, fn, seed, counts, steps):
    model = mlp(seed, SIZES)
    ddp = DataParallel(model)  # built before recording: its start-up broadcast is not the learner's
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    out, finish = [], ddp.finish_gradient_synchronization

    def finish_watched():  # an all-reduce started here, not in a backward: no backward ran outside no_sync
        recorder.phase = f"finish {step}"
        try:
            return finish()
        finally:
            recorder.phase = f"step {step}"
    ddp.finish_gradient_synchronization = finish_watched
    for step in range(steps):
        opt.zero_grad()
        recorder.phase = f"step {step}"
        recorder.call(fn, ctx, ddp, _micro_batches(seed, step, counts)[ctx.rank])
        out.append(grads(model))
        try:
            opt.step()
        except RuntimeError as err:  # DataParallel refuses a step on gradients it has not synchronised
            return {"grads": out, "unfinished": str(err), "buckets": len(ddp.buckets)}
    return {"grads": out, "unfinished": None, "buckets": len(ddp.buckets)}


MEAN_OF_MEANS = Text("각 마이크로배치의 평균 손실을 k로 나눴습니다(평균들의 평균): 토큰이 적은 마이크로배치도 많은 것과 같은 무게가 됩니다. "
                     "배치 전체의 토큰당 평균이 되려면 마이크로배치 손실에 (그 토큰 수 / 이 랭크의 토큰 수)를 곱하세요.",
                     "each micro-batch's mean loss was divided by k (a mean of means): a micro-batch with few tokens "
                     "weighs as much as a large one. For the whole batch's per-token mean, weight each micro-batch's "
                     "loss by (its tokens / this rank's tokens).")
NOT_SCALED = Text("마이크로배치 손실을 나누지 않고 그래디언트를 더했습니다: 결과가 마이크로배치 평균의 합이라 약 k배입니다.",
                  "the micro-batch losses were not scaled: the gradients add up the micro-batch means, about k times "
                  "too large.")
MISTAKES = ((lambda n, total, k: 1 / k, MEAN_OF_MEANS), (lambda n, total, k: 1.0, NOT_SCALED))


def _values(case, outputs, seed, counts, steps):
    expected = _reference(seed, counts, steps, lambda n, total, k: n / total)
    for step in range(steps):
        for rank, output in enumerate(outputs):
            got = output["out"]["grads"][step]
            problem = compare_grads(case, rank, expected[step], got, case.world_size)
            if problem is None:
                continue
            for weigh, hint in MISTAKES:
                wrong = _reference(seed, counts, steps, weigh)[step]
                if compare_grads(case, rank, wrong, got, case.world_size) is None:
                    problem.hint = hint
            if problem.hint is OWN_GRADIENT or problem.hint is None:
                problem.hint = Text("그래디언트가 랭크들 사이에 평균되지 않았거나 일부 마이크로배치만 평균되었습니다: 마지막 "
                                    "마이크로배치의 backward만 no_sync() 밖에서 하고 그 뒤에 ddp.finish_gradient_synchronization()을 "
                                    "부르세요(그래야 p.grad에 모든 마이크로배치가 들어 있을 때 동기화됩니다).",
                                    "the gradients were not averaged over the ranks, or only some micro-batches were: "
                                    "run only the last micro-batch's backward outside no_sync() and then call "
                                    "ddp.finish_gradient_synchronization() (so the sync happens once p.grad holds every "
                                    "micro-batch).")
            if step:
                problem.detail = Text(f"{step + 1}번째 스텝, ", f"step {step + 1}, ") + problem.detail
            return problem
    return None


def _judge(case, fn, timeout):
    seed, counts, steps = case.params["seed"], case.params["counts"], case.params["steps"]
    outputs = harness.run(_body, case.world_size, (fn, seed, counts, steps), timeout)
    for rank, output in enumerate(outputs):
        if output["out"]["unfinished"]:
            return failed(case, Text(f"랭크 {rank}: 옵티마이저 스텝을 할 수 없습니다: {output['out']['unfinished']}",
                                     f"rank {rank}: the optimizer step was refused: {output['out']['unfinished']}"),
                          Text("함수가 끝나기 전에 마지막 backward 뒤에 ddp.finish_gradient_synchronization()을 부르세요.",
                               "call ddp.finish_gradient_synchronization() after the last backward, before your "
                               "function returns."))
    problem = _values(case, outputs, seed, counts, steps)
    if problem:
        return problem
    k = len(counts[0])
    for rank, output in enumerate(outputs):
        buckets = output["out"]["buckets"]
        for step in range(steps):
            late = [c for c in output["calls"] if c.kind == "all_reduce" and c.phase == f"finish {step}" and c.numel > 1]
            reduces = len(late) + sum(1 for c in output["calls"]
                                      if c.kind == "all_reduce" and c.phase == f"step {step}" and c.numel > 1)
            if late and len(late) == reduces:
                return failed(case, Text(f"랭크 {rank}, {step + 1}번째 스텝: 모든 backward가 ddp.no_sync() 안에서 돌았습니다. mpkit는 "
                                         "finish_gradient_synchronization()에서 보내 주지만, torch의 DDP에서는 그래디언트가 평균되지 "
                                         "않습니다.", f"rank {rank}, step {step + 1}: every backward ran inside ddp.no_sync(); "
                                         "mpkit sends the buckets in finish_gradient_synchronization(), but with torch's DDP the "
                                         "gradients would never be averaged."),
                              Text("마지막 마이크로배치의 backward는 no_sync 밖에서 하세요: 그 backward가 버킷 all-reduce를 시작해 "
                                   "역전파와 겹칩니다.", "run the last micro-batch's backward outside no_sync: that backward "
                                   "starts the buckets' all-reduces, overlapped with the backward."))
            if reduces > buckets:
                return failed(case, Text(f"랭크 {rank}, {step + 1}번째 스텝: all-reduce {reduces}번. 목표: 마이크로스텝 {k}개에 버킷마다 "
                                         f"한 번({buckets}번).", f"rank {rank}, step {step + 1}: {reduces} all-reduces; target: "
                                         f"one per bucket per {k} micro-steps ({buckets})."),
                              Text("값은 맞지만 마이크로배치마다 동기화했습니다: 마지막을 뺀 모든 마이크로배치의 backward를 ddp.no_sync() "
                                   "안에서 하면 그래디언트가 로컬에 쌓이고, 마지막 한 번만 보냅니다(통신 k배 절약).",
                                   "the values are right, but every micro-batch synchronised: run every micro-batch's "
                                   "backward but the last inside ddp.no_sync(), so gradients pile up locally and are "
                                   "sent once (k times less communication)."))
    return passed(case, Text(f"마이크로스텝 {k}개에 all-reduce {outputs[0]['out']['buckets']}번", f"{outputs[0]['out']['buckets']} "
                             f"all-reduce per {k} micro-steps"))


STUB = '''def accumulate_gradients(ctx, ddp, micro_batches):
    """그래디언트 누적(gradient accumulation). micro_batches는 이 랭크의 (x, y) k개, 마이크로배치의 손실은
    F.cross_entropy(ddp(x), y)(그 토큰(행)들의 평균)입니다. 마이크로배치마다 토큰 수가 다릅니다(랭크마다 합은 같음).
    함수가 끝나면 모든 p.grad가 전역 배치 전체를 한 장치에서 토큰당 평균 손실로 계산한 그래디언트와 같아야 합니다.
    ddp는 mpkit의 DataParallel: backward가 그래디언트를 랭크 평균하고, ddp.no_sync() 안의 backward는 로컬에 쌓기만 하며,
    ddp.finish_gradient_synchronization()이 동기화를 마칩니다. 목표: 마이크로스텝 k개에 all-reduce 한 번(버킷마다), k번이 아님.
    Gradient accumulation. micro_batches: this rank's k (x, y) pairs; a micro-batch's loss is
    F.cross_entropy(ddp(x), y), the mean over its tokens (rows). Micro-batches hold different numbers of tokens
    (every rank the same total). When the function returns, every p.grad must equal one device's gradient of the
    whole global batch with the loss averaged over all its tokens. ddp is mpkit's DataParallel: a backward averages
    the gradients over the ranks, a backward inside ddp.no_sync() only accumulates locally, and
    ddp.finish_gradient_synchronization() completes the sync. Target: one all-reduce (per bucket) per k
    micro-steps, not k."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

NO_SYNC = Text("ddp가 이미 동기화를 시작한 뒤에 다음 마이크로배치가 들어왔습니다: 마지막을 뺀 마이크로배치의 backward는 "
               "ddp.no_sync() 안에서 하세요(그래디언트가 로컬에 쌓이고, 마지막 backward가 한 번 보냅니다).",
               "the next micro-batch came after ddp had started synchronising: run every micro-batch's backward but the "
               "last inside ddp.no_sync() (gradients pile up locally and the last backward sends them once).")

EXERCISES = [
    Exercise("accumulate_gradients", "06", Text("no_sync로 그래디언트 누적", "Gradient accumulation with no_sync"), STUB, (
        Text("마이크로배치 k개의 그래디언트를 로컬에 더한 뒤 랭크 사이 평균은 한 번만 하면 됩니다. 그리고 손실의 크기를 큰 배치 하나와 "
             "같게 맞춰야 합니다.",
             "Add the k micro-batches' gradients locally and average over the ranks only once. And scale the loss so it "
             "is the one of a single big batch."),
        Text("전역 토큰당 평균 = Σ 토큰 손실 / 전체 토큰 수. 랭크마다 토큰 수가 같으니, 랭크 안에서 마이크로배치 i의 평균 손실에 "
             "n_i / Σn을 곱하고 DDP의 랭크 평균에 맡기면 됩니다. 1/k는 n_i가 모두 같을 때만 맞습니다.",
             "Global per-token mean = Σ token losses / all tokens. Every rank has the same number of tokens, so within a "
             "rank multiply micro-batch i's mean loss by n_i / Σn and let DDP's average over ranks do the rest. 1/k is "
             "right only when every n_i is the same."),
        Text("total = 이 랭크 토큰 수. 마지막 마이크로배치 전까지는 `with ddp.no_sync():` 안에서 (가중한 손실).backward(), 마지막은 "
             "밖에서 backward, 그다음 ddp.finish_gradient_synchronization().",
             "total = this rank's tokens. Every micro-batch but the last: `with ddp.no_sync():` around the weighted "
             "loss's backward(); the last one's backward outside it, then ddp.finish_gradient_synchronization().")),
        [Case(Text("2 랭크, 같은 크기의 마이크로배치 2개", "2 ranks, 2 micro-batches of equal size"), 2,
              {"seed": 81, "counts": [[3, 3], [3, 3]], "steps": 1}),
         Case(Text("2 랭크, 토큰 수가 다른 마이크로배치 3개", "2 ranks, 3 micro-batches of different token counts"), 2,
              {"seed": 82, "counts": [[2, 5, 1], [5, 1, 2]], "steps": 1}),
         Case(Text("3 랭크, 마이크로배치 4개, 2 스텝(zero_grad 기본값)", "3 ranks, 4 micro-batches, 2 steps (zero_grad's defaults)"), 3,
              {"seed": 83, "counts": [[1, 3, 2, 2], [2, 2, 3, 1], [4, 1, 1, 2]], "steps": 2})],
        _judge, crash_hints=tuple((text, NO_SYNC) for text in ("got a gradient after its bucket was all-reduced",
                                                                "were never synchronised"))),
]
