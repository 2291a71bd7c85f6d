"""Lab 01 exercises: average gradients across ranks, then the bucketed version launched from
backward hooks (DDP's design, Li et al. 2020).

Every rank trains the same model on its slice of one global batch; after the learner's code every
rank's gradients must equal the full batch's gradient on one device (the mean loss of equal slices
averages to the mean over the batch). Frozen parameters keep ``grad=None``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mpkit.exercises import harness
from mpkit.exercises.common import (NONE_GRAD, OWN_GRADIENT, Case, Exercise, batch, close, compare_grads, failed, grads,
                                    mlp, passed)
from mpkit.exercises.result import Text

ROWS = 8


def _reference(seed, sizes, steps, rows=slice(None)):
    """Per-step gradients of ``rows`` of each batch on one device (SGD steps on the whole batch's
    gradient between): the whole batch's by default, one rank's own slice for the hints."""
    model, whole = mlp(seed, sizes), mlp(seed, sizes)
    opt = torch.optim.SGD([p for p in whole.parameters() if p.requires_grad], lr=0.1)
    out = []
    for step in range(steps):
        x, y = batch(seed + step, ROWS, sizes[0], sizes[-1])
        model.load_state_dict(whole.state_dict())
        model.zero_grad()
        F.cross_entropy(model(x[rows]), y[rows]).backward()
        out.append(grads(model))
        opt.zero_grad()
        F.cross_entropy(whole(x), y).backward()
        opt.step()
    return out


def _rows(rank, n):
    return slice(rank * ROWS // n, (rank + 1) * ROWS // n)


def _train(ctx, recorder, seed, sizes, steps, after_backward, before=None):
    model = mlp(seed, sizes)
    helper = before(model) if before else None
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    out, unwaited, waited_in_backward = [], [], []
    for step in range(steps):
        x, y = batch(seed + step, ROWS, sizes[0], sizes[-1])
        rows = _rows(ctx.rank, ctx.world_size)
        opt.zero_grad()  # torch's default: set_to_none=True
        recorder.phase = f"backward {step}"
        loss = F.cross_entropy(model(x[rows]), y[rows])
        started = len(recorder.calls)
        recorder.call(loss.backward)  # the learner's hooks, if any, run inside backward
        # asynchronous works started in the backward and already waited on there: the backward blocked
        waited_in_backward.append(sum(not c.blocking for c in recorder.calls[started:]) - len(recorder.pending))
        recorder.phase = f"sync {step}"
        recorder.call(after_backward, model, helper)
        out.append(grads(model))
        unwaited.append(len(recorder.pending))  # works the step's gradients were read without waiting for
        recorder.pending.clear()
        opt.step()
    return {"grads": out, "unwaited": unwaited, "waited_in_backward": waited_in_backward}


UNWAITED_HINT = Text("비동기 all-reduce(async_op=True)의 결과를 wait() 없이 썼습니다: 쓰기 전에 work.wait()를 부르세요.",
                     "an asynchronous all-reduce (async_op=True) was used without wait(): call work.wait() before using "
                     "its result.")
LATER_STEP_HINT = Text("첫 스텝은 맞고 그다음 스텝이 틀립니다: 이전 스텝의 상태(버킷 카운터, 남은 work, 그래디언트)를 "
                       "초기화하지 않았습니다.", "the first step is right and a later one wrong: state from the previous step "
                       "(a bucket counter, pending works, gradients) was not reset.")


FROZEN_HOOK = ("doesn't require gradient", Text("고정된(requires_grad=False) 파라미터에는 훅을 걸 수 없고 그래디언트도 없습니다: "
                                               "requires_grad인 파라미터만 버킷에 넣으세요.",
                                               "a frozen parameter (requires_grad=False) takes no hook and never gets a "
                                               "gradient: put only the parameters with requires_grad in buckets."))
BROADCAST = Text("모든 랭크가 랭크 0의 그래디언트를 가졌습니다: broadcast는 한 랭크의 값을 복사할 뿐 평균을 내지 않습니다. "
                 "all-reduce(합)한 뒤 world_size로 나누세요.",
                 "every rank holds rank 0's gradient: a broadcast copies one rank's value, it does not average. "
                 "All-reduce (sum), then divide by the world size.")


def _copied_from_rank0(outputs, seed, sizes, steps, step) -> bool:
    """Does every rank hold rank 0's own gradient (a broadcast where an average belongs)?"""
    rank0 = _reference(seed, sizes, steps, _rows(0, len(outputs)))[step]
    return len(outputs) > 1 and all(
        want is None or (o["out"]["grads"][step].get(name) is not None and close(want, o["out"]["grads"][step][name]))
        for o in outputs for name, want in rank0.items())


def _judge_grads(case, outputs, seed, sizes, steps):
    n = case.world_size
    expected = _reference(seed, sizes, steps)
    for step in range(steps):
        for rank, output in enumerate(outputs):
            problem = compare_grads(case, rank, expected[step], output["out"]["grads"][step], n)
            if problem:  # again with the rank's own gradient, to recognise one that was never averaged
                local = _reference(seed, sizes, steps, _rows(rank, n))[step]
                problem = compare_grads(case, rank, expected[step], output["out"]["grads"][step], n, local)
                if problem.hint in (None, OWN_GRADIENT) and _copied_from_rank0(outputs, seed, sizes, steps, step):
                    problem.hint = BROADCAST
                if output["out"]["unwaited"][step] and problem.hint is None:
                    problem.hint = UNWAITED_HINT
                if step > 0:
                    problem.detail = Text(f"{step + 1}번째 스텝, ", f"step {step + 1}, ") + problem.detail
                    problem.hint = problem.hint or LATER_STEP_HINT
                return problem
    return None


# ---- average_gradients ----

def _average_body(ctx, recorder, fn, seed, sizes, steps):
    return _train(ctx, recorder, seed, sizes, steps, lambda model, _: fn(ctx, model))


def _judge_average(case, fn, timeout):
    seed, sizes, steps = case.params["seed"], case.params["sizes"], case.params["steps"]
    outputs = harness.run(_average_body, case.world_size, (fn, seed, sizes, steps), timeout)
    return _judge_grads(case, outputs, seed, sizes, steps) or passed(case)


# ---- BucketedGradientSync ----

def _bucket_body(ctx, recorder, cls, seed, sizes, steps, bucket_mb):
    def make(model):
        return recorder.call(cls, ctx, model, bucket_mb)
    return _train(ctx, recorder, seed, sizes, steps, lambda model, sync: sync.finish(), before=make)


def bucket_bounds(sizes_bytes, bucket_bytes):
    """The fewest all-reduces a bucketing can use: a bucket holds at most ``bucket_bytes`` unless a
    single gradient is larger."""
    count, filled = 0, None
    for size in sizes_bytes:
        if filled is None or filled + size > bucket_bytes:
            count, filled = count + 1, size
        else:
            filled += size
    return count


def _judge_buckets(case, cls, timeout):
    seed, sizes, steps, bucket_mb = (case.params[k] for k in ("seed", "sizes", "steps", "bucket_mb"))
    outputs = harness.run(_bucket_body, case.world_size, (cls, seed, sizes, steps, bucket_mb), timeout)
    problem = _judge_grads(case, outputs, seed, sizes, steps)
    if problem:
        if problem.hint is OWN_GRADIENT:
            problem.hint = Text("이 그래디언트는 평균되지 않았습니다: 이 파라미터의 버킷이 보내지지 않았거나(예: 훅이 불리지 않는 "
                                "고정된(frozen) 파라미터가 든 버킷은 결코 차지 않음), 평균을 p.grad에 돌려놓지 않았습니다.",
                                "this gradient was never averaged: its bucket was never sent (a bucket holding a frozen "
                                "parameter, whose hook never fires, never fills), or the average was not copied back "
                                "into p.grad (still the rank's own gradient).")
        return problem
    model = mlp(seed, sizes)
    trainable = [p.numel() * 4 for p in model.parameters() if p.requires_grad]
    bucket_bytes = bucket_mb * 2**20
    largest = max(max(trainable), bucket_bytes)
    fewest = bucket_bounds(trainable, bucket_bytes)
    for rank, output in enumerate(outputs):
        for step in range(steps):
            reduces = [c for c in output["calls"] if c.kind == "all_reduce" and c.phase in (f"backward {step}", f"sync {step}")]
            where = Text(f"랭크 {rank}, {step + 1}번째 스텝:", f"rank {rank}, step {step + 1}:")
            too_big = [c.nbytes for c in reduces if c.nbytes > largest]
            if too_big:
                return failed(case, where + Text(f"{too_big[0]} B짜리 all-reduce가 있습니다(버킷 한도 {bucket_bytes:.0f} B).",
                                                 f"an all-reduce of {too_big[0]} B (buckets hold at most {bucket_bytes:.0f} B)."),
                              Text("버킷이 bucket_mb를 넘지 않게 채우세요: 다음 그래디언트가 넘치게 하면 지금 버킷을 먼저 보내세요.",
                                   "keep each bucket within bucket_mb: when the next gradient would overflow it, send the "
                                   "current bucket first."))
            if sum(c.nbytes for c in reduces) > sum(trainable):
                return failed(case, where + Text("그래디언트보다 많은 바이트를 all-reduce했습니다.",
                                                 "more bytes were all-reduced than there are gradients."),
                              Text("버킷마다 한 번만 all-reduce하세요(같은 버킷을 두 번, 또는 고정된 파라미터까지 보내지 않기).",
                                   "all-reduce each bucket once (not twice, and not frozen parameters)."))
            if len(reduces) > fewest and len(reduces) == len(trainable) > 1:
                return failed(case, where + Text(f"all-reduce {len(reduces)}번: 파라미터마다 한 번입니다.",
                                                 f"{len(reduces)} all-reduces: one per parameter."),
                              Text(f"그래디언트를 버킷으로 묶어 평평하게(flatten) 만든 뒤 버킷마다 한 번 보내세요: 여기서는 "
                                   f"{fewest}번이면 됩니다.", f"flatten gradients into buckets and send one all-reduce per "
                                   f"bucket: {fewest} would do here."))
            blocking = [c for c in reduces if c.phase == f"backward {step}" and c.blocking]
            if blocking:
                return failed(case, where + Text("훅 안의 all-reduce가 블로킹입니다: 역전파가 그 통신이 끝날 때까지 멈춥니다.",
                                                 "an all-reduce inside a hook is blocking: the backward stops until it "
                                                 "finishes."),
                              Text("훅에서는 dist.all_reduce(flat, async_op=True)로 시작만 하고, finish()에서 wait()하세요: "
                                   "그래야 통신이 나머지 역전파와 겹칩니다.",
                                   "in the hook only start it, dist.all_reduce(flat, async_op=True), and wait() in "
                                   "finish(): that is what overlaps the communication with the rest of the backward."))
            if output["out"]["waited_in_backward"][step] > 0:
                return failed(case, where + Text("all-reduce를 async_op=True로 시작했지만 역전파 안에서(훅에서) wait()했습니다: "
                                                 "역전파가 그 통신이 끝날 때까지 멈추니 겹침이 없습니다.",
                                                 "the all-reduce was started with async_op=True but wait()ed on inside the "
                                                 "backward (in the hook): the backward stops until it finishes, so nothing "
                                                 "overlaps."),
                              Text("async_op=True 플래그만으로는 겹치지 않습니다: 훅에서는 Work를 저장만 하고, 역전파가 끝난 뒤 "
                                   "finish()에서 모두 wait()하세요.", "the async_op flag alone does not overlap anything: "
                                   "in the hook only keep the Work, and wait() on every one in finish(), after the backward."))
            if not any(c.phase == f"backward {step}" for c in reduces):
                return failed(case, where + Text("모든 all-reduce가 backward가 끝난 뒤에 시작했습니다.",
                                                 "every all-reduce started after the backward had finished."),
                              Text("버킷이 차는 즉시 그래디언트 훅(register_post_accumulate_grad_hook)에서 비동기 all-reduce"
                                   "(async_op=True)를 시작하세요: 나머지 역전파와 겹치는 것이 버킷의 목적입니다.",
                                   "start each bucket's all-reduce (async_op=True) from a gradient hook "
                                   "(register_post_accumulate_grad_hook) as soon as the bucket is full: overlapping the "
                                   "rest of the backward is what buckets are for."))
    return passed(case)


STUB_AVG = '''def average_gradients(ctx, model):
    """loss.backward() 뒤에 불립니다. 모든 랭크의 p.grad를 평균해 제자리에 두세요(고정된 파라미터는 p.grad가 None).
    Called after loss.backward(): average every p.grad over all ranks, in place (frozen parameters have
    p.grad None). dist.all_reduce / ctx.comm.all_reduce, ctx.world_size."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''
STUB_BUCKETS = '''class BucketedGradientSync:
    """DDP처럼: 역전파 중 그래디언트가 준비되는 대로 bucket_mb 이하의 버킷에 모아, 버킷이 차면 그 버킷을 평평하게(flatten)
    만들어 비동기 all-reduce 한 번을 시작합니다. finish()는 모든 all-reduce를 기다리고 평균을 p.grad에 되돌려 놓습니다.
    Like DDP: as gradients become ready during backward, gather them into buckets of at most bucket_mb; when a
    bucket is full, flatten it and start one asynchronous all-reduce. finish() waits for every all-reduce and puts
    the averages back into p.grad. Called as: sync = BucketedGradientSync(ctx, model, bucket_mb); then every step
    loss.backward(); sync.finish()."""

    def __init__(self, ctx, model, bucket_mb):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")

    def finish(self):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

SIZES = (6, 8, 8, 3)
SIZES_6 = (6, 8, 8, 8, 3)  # six trainable tensors: a division by their count cannot pass for one by 4 ranks
BIG = (16, 32, 32, 32, 4)  # 2.8k trainable floats: several 4 KB buckets

EXERCISES = [
    Exercise("average_gradients", "01", Text("그래디언트 평균", "Average the gradients"), STUB_AVG, (
        Text("각 랭크는 배치의 자기 몫으로 그래디언트를 구했습니다. 모든 랭크에서 같은 평균이 되어야 합니다.",
             "Each rank computed gradients on its slice of the batch; every rank must end with the same average."),
        Text("평균 = (랭크들의 그래디언트 합) / world_size. all-reduce는 합을 줍니다.",
             "average = (sum over ranks) / world_size; all-reduce gives the sum."),
        Text("for p in model.parameters():\n    if p.grad is not None:\n        dist.all_reduce(p.grad); p.grad /= ctx.world_size",
             "for p in model.parameters():\n    if p.grad is not None:\n        dist.all_reduce(p.grad); p.grad /= ctx.world_size")),
        [Case(Text("2 랭크", "2 ranks"), 2, {"seed": 1, "sizes": SIZES, "steps": 1}),
         Case(Text("4 랭크, 고정된 레이어", "4 ranks, a frozen layer"), 4, {"seed": 2, "sizes": SIZES_6, "steps": 1}),
         Case(Text("2 랭크, 2 스텝(zero_grad 기본값)", "2 ranks, 2 steps (zero_grad's defaults)"), 2,
              {"seed": 3, "sizes": SIZES, "steps": 2})],
        _judge_average, crash_hints=(NONE_GRAD,)),
    Exercise("bucketed_gradients", "01", Text("버킷과 훅으로 그래디언트 동기화", "Bucketed gradient sync from hooks"),
             STUB_BUCKETS, (
        Text("역전파는 마지막 레이어부터 그래디언트를 만듭니다. 준비된 그래디언트를 버킷에 모으고, 버킷이 차면 바로 보내세요.",
             "Backward produces gradients from the last layer back; collect ready gradients into a bucket and send it as "
             "soon as it is full."),
        Text("p.register_post_accumulate_grad_hook(hook): p.grad가 채워지면 불립니다. 버킷 바이트 = Σ numel·4 ≤ bucket_mb·2^20. "
             "torch.cat으로 평평하게, dist.all_reduce(flat, async_op=True)가 Work를 돌려줍니다.",
             "p.register_post_accumulate_grad_hook(hook) runs once p.grad is filled. Bucket bytes = Σ numel·4 ≤ "
             "bucket_mb·2^20. Flatten with torch.cat; dist.all_reduce(flat, async_op=True) returns a Work."),
        Text("__init__: 학습할 파라미터를 역순으로 버킷에 배정, 각 파라미터에 훅 등록.\nhook(p): 버킷의 준비 수 +1; 다 찼으면 "
             "flat = torch.cat([q.grad.reshape(-1) ...]); work = all_reduce(flat, async_op=True) 저장.\nfinish(): 모든 work.wait(); "
             "flat /= world_size; 각 q.grad.copy_(조각); 다음 스텝을 위해 상태 초기화.",
             "__init__: assign trainable parameters to buckets in reverse order; register a hook on each.\nhook(p): count it "
             "ready in its bucket; when all are ready: flat = torch.cat([q.grad.reshape(-1) ...]); keep work = "
             "all_reduce(flat, async_op=True).\nfinish(): wait() every work; flat /= world_size; copy each piece back into "
             "q.grad; reset the state for the next step.")),
        [Case(Text("2 랭크, 버킷 하나(25 MB)", "2 ranks, one bucket (25 MB)"), 2,
              {"seed": 4, "sizes": BIG, "steps": 1, "bucket_mb": 25.0}),
         Case(Text("2 랭크, 4 KB 버킷 여러 개", "2 ranks, several 4 KB buckets"), 2,
              {"seed": 5, "sizes": BIG, "steps": 1, "bucket_mb": 4096 / 2**20}),
         Case(Text("4 랭크, 4 KB 버킷, 2 스텝", "4 ranks, 4 KB buckets, 2 steps"), 4,
              {"seed": 6, "sizes": BIG, "steps": 2, "bucket_mb": 4096 / 2**20})],
        _judge_buckets, uses="class", crash_hints=(NONE_GRAD, FROZEN_HOOK), target="BucketedGradientSync"),
]
