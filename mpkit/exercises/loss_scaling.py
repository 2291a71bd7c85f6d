"""Lab 06 §7 exercise: a dynamic loss scaler for fp16 training on ranks that hold different
gradients (pipeline stages, shards), with torch.amp.GradScaler's rules.

Each rank trains its own stage (a different Linear) with the learner's scaler: ``scale(loss)``
before backward, ``step(optimizer)`` (unscale the gradients, find inf/NaN, agree with every rank,
step or skip), ``update()`` (after an overflow: scale × backoff_factor and the count of good steps
back to 0; after growth_interval good steps in a row: scale × growth_factor), ``get_scale()``.
The checker writes inf or NaN into one gradient of some ranks at some steps, the way an fp16
overflow shows. Every rank must skip exactly the steps where any rank overflowed: a case where
only one rank overflows catches a rank deciding alone. Checked per step: every rank's scale and
parameters against the reference (``reference_scales`` follows GradScaler, which
tests/test_exercises_lab06.py checks against torch.amp.GradScaler itself), and the agreement's
cost: one collective on at most N elements per step.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mpkit.exercises import harness
from mpkit.exercises.common import Case, Exercise, close, failed, mismatch, passed, seeded
from mpkit.exercises.result import Text

LR = 0.1


def _stage(seed, rank):
    torch.manual_seed(seed + rank)
    return torch.nn.Linear(4, 3)


def _data(seed, rank, step):
    g = seeded(seed + 100 * step + rank)
    return torch.randn(5, 4, generator=g), torch.randn(5, 3, generator=g)


def _options(case):
    return {k: case.params[k] for k in ("init_scale", "growth_interval") if k in case.params}


def reference_scales(overflow_steps, steps, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                     growth_interval=2000):
    """The scale after each step's update, GradScaler's rule, for overflows at ``overflow_steps``."""
    scale, good, out = init_scale, 0, []
    for step in range(steps):
        if step in overflow_steps:
            scale, good = scale * backoff_factor, 0
        else:
            good += 1
            if good == growth_interval:
                scale, good = scale * growth_factor, 0
        out.append(scale)
    return out


def _reference(case, rank, overflow_steps):
    """(scales, parameters after each step) of ``rank`` when the steps in ``overflow_steps`` are skipped."""
    stage = _stage(case.params["seed"], rank)
    opt = torch.optim.SGD(stage.parameters(), lr=LR)
    params = []
    for step in range(case.params["steps"]):
        opt.zero_grad()
        x, y = _data(case.params["seed"], rank, step)
        F.mse_loss(stage(x), y).backward()
        if step not in overflow_steps:
            opt.step()
        params.append(torch.cat([p.detach().reshape(-1) for p in stage.parameters()]))
    return reference_scales(overflow_steps, case.params["steps"], **_options(case)), params


def _overflows(case, rank=None):
    return {step for step, who, _ in case.params["overflow"] if rank is None or who == rank}


def _body(ctx, recorder, cls, case):
    stage = _stage(case.params["seed"], ctx.rank)
    opt = torch.optim.SGD(stage.parameters(), lr=LR)
    scaler = recorder.call(cls, ctx, **_options(case))
    scales, params = [], []
    for step in range(case.params["steps"]):
        recorder.phase = f"step {step}"
        opt.zero_grad()
        x, y = _data(case.params["seed"], ctx.rank, step)
        loss = F.mse_loss(stage(x), y)
        recorder.call(lambda: scaler.scale(loss).backward())
        for at, who, value in case.params["overflow"]:
            if (at, who) == (step, ctx.rank):  # what an fp16 overflow leaves in a gradient
                stage.weight.grad[0, 0] = value
        recorder.call(scaler.step, opt)
        recorder.call(scaler.update)
        scales.append(float(recorder.call(scaler.get_scale)))
        params.append(torch.cat([p.detach().reshape(-1) for p in stage.parameters()]))
    return {"scales": scales, "params": params}


ALONE = Text("이 랭크는 자기 그래디언트만 보고 결정했습니다: 다른 랭크가 넘쳤는데도 스텝을 했습니다(또는 그 반대). 랭크마다 다른 "
             "그래디언트를 가지므로 found-inf 플래그를 all-reduce(MAX 또는 SUM)해 모든 랭크가 함께 건너뛰고 함께 줄여야 합니다.",
             "this rank decided from its own gradients alone: it stepped although another rank overflowed (or the "
             "other way round). The ranks hold different gradients, so all-reduce the found-inf flag (MAX or SUM) and "
             "let every rank skip and back off together.")


def _scale_hint(case, rank, step, got, want):
    alone = reference_scales(_overflows(case, rank), case.params["steps"], **_options(case))
    if got == alone[: len(got)] and _overflows(case) != _overflows(case, rank):
        return ALONE
    if step in _overflows(case):
        return Text("넘친(inf/NaN) 스텝 뒤에는 스케일에 backoff_factor(0.5)를 곱하고 좋은 스텝 수를 0으로 되돌립니다.",
                    "after an overflow (inf/NaN) step, multiply the scale by backoff_factor (0.5) and reset the count of "
                    "good steps to 0.")
    return Text(f"좋은 스텝이 연속 growth_interval번이면 스케일에 growth_factor(2)를 곱하고 세기를 0부터 다시 합니다(넘친 스텝 뒤에도 "
                f"0부터). growth_interval = {case.params.get('growth_interval', 2000)}.",
                f"after growth_interval good steps in a row multiply the scale by growth_factor (2) and count again from 0 "
                f"(also from 0 after an overflow). growth_interval = {case.params.get('growth_interval', 2000)}.")


def _param_hint(case, rank, step, got, want, wants):
    if not torch.isfinite(got).all():
        return Text("inf/NaN이 파라미터에 들어갔습니다: 넘친 스텝에서는 optimizer.step()을 건너뛰세요.",
                    "inf/NaN reached the parameters: skip optimizer.step() on an overflow step.")
    _, alone = _reference(case, rank, _overflows(case, rank))
    if close(alone[step], got):
        return ALONE
    before = wants[step - 1] if step else torch.cat([p.detach().reshape(-1) for p in _stage(case.params["seed"], rank).parameters()])
    if close(want, before) and not close(got, before):
        return ALONE
    return Text("옵티마이저는 원래 크기의 그래디언트로 스텝해야 합니다: optimizer.step() 전에 모든 p.grad를 스케일로 나누세요(unscale).",
                "the optimizer must step on gradients of their true size: divide every p.grad by the scale (unscale) "
                "before optimizer.step().")


def _judge(case, cls, timeout):
    n, steps = case.world_size, case.params["steps"]
    outputs = harness.run(_body, n, (cls, case), timeout)
    for rank, output in enumerate(outputs):
        scales, params = _reference(case, rank, _overflows(case))
        got = output["out"]
        for step in range(steps):
            if got["scales"][step] != scales[step]:
                return failed(case, Text(f"랭크 {rank}, {step + 1}번째 스텝(0부터 {step}) 뒤 스케일 {got['scales'][step]:g}, 기댓값 "
                                         f"{scales[step]:g}.", f"rank {rank}, after step {step} (from 0): scale "
                                         f"{got['scales'][step]:g}, expected {scales[step]:g}."),
                              _scale_hint(case, rank, step, got["scales"][: step + 1], scales))
            if not close(params[step], got["params"][step]):
                return failed(case, mismatch(Text(f"랭크 {rank}, 스텝 {step} 뒤 파라미터:", f"rank {rank}, parameters after "
                                                  f"step {step}:"), params[step], got["params"][step]),
                              _param_hint(case, rank, step, got["params"][step], params[step], params))
        for step in range(steps):
            calls = [c for c in output["calls"] if c.phase == f"step {step}" and c.kind not in ("send", "recv")]
            elements = sum(c.numel for c in calls)
            if len(calls) > 1 or elements > n:
                return failed(case, Text(f"랭크 {rank}, 스텝 {step}: 집합 통신 {len(calls)}번, 원소 {elements}개. 목표: 플래그 하나를 "
                                         f"한 번(원소 최대 {n}개).", f"rank {rank}, step {step}: {len(calls)} collective(s) on "
                                         f"{elements} elements; target: one collective on one flag (at most {n} elements)."),
                              Text("합의에 필요한 것은 '어느 랭크든 넘쳤는가' 한 비트입니다: 모든 그래디언트를 보내거나 파라미터마다 "
                                   "따로 보내지 말고, found_inf 하나를 all-reduce(MAX)하세요.",
                                   "agreeing needs one bit, 'did any rank overflow': do not send the gradients or a flag "
                                   "per parameter; all-reduce one found_inf (MAX)."))
            if not calls and n > 1:
                return failed(case, Text(f"랭크 {rank}, 스텝 {step}: 랭크들이 넘침을 합의하지 않았습니다(통신 없음).",
                                         f"rank {rank}, step {step}: the ranks never agreed on the overflow (no communication)."),
                              ALONE)
    return passed(case, Text(f"스케일 {outputs[0]['out']['scales']}", f"scales {outputs[0]['out']['scales']}"))


STUB = '''class DynamicLossScaler:
    """동적 손실 스케일링(torch.amp.GradScaler의 규칙). 랭크마다 다른 그래디언트(자기 스테이지나 샤드)를 가집니다.
    scale(loss): loss × 스케일. step(optimizer): 옵티마이저의 모든 p.grad를 스케일로 나누고(unscale), inf/NaN을 찾아 모든
    랭크가 합의한 뒤(한 랭크라도 넘치면 모두), 넘쳤으면 건너뛰고 아니면 optimizer.step(). update(): 넘쳤으면 스케일 ×
    backoff_factor, 좋은 스텝 수 0; 아니면 좋은 스텝 수 +1, growth_interval번 연속이면 스케일 × growth_factor, 다시 0.
    get_scale(): 지금 스케일(float). 목표: 합의는 스텝마다 집합 통신 한 번, 플래그 하나(원소 최대 N개).
    Dynamic loss scaling with torch.amp.GradScaler's rules, on ranks that hold different gradients (each its own stage
    or shard). scale(loss): loss times the scale. step(optimizer): divide every p.grad of the optimizer by the scale
    (unscale), look for inf/NaN, agree with every rank (one rank overflowing is enough), then skip the step or call
    optimizer.step(). update(): after an overflow the scale times backoff_factor and the count of good steps to 0;
    otherwise count the good step and after growth_interval in a row multiply the scale by growth_factor, count from
    0 again. get_scale(): the scale now (a float). Target: the agreement costs one collective on one flag (at most
    N elements) per step."""

    def __init__(self, ctx, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")

    def scale(self, loss):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")

    def step(self, optimizer):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")

    def update(self):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")

    def get_scale(self):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

INF, NAN = float("inf"), float("nan")

EXERCISES = [
    Exercise("loss_scaler", "06", Text("동적 손실 스케일러", "A dynamic loss scaler"), STUB, (
        Text("fp16의 작은 그래디언트는 0이 되어 사라지므로 손실에 큰 수를 곱해 역전파하고, 스텝 전에 다시 나눕니다. 너무 크면 inf가 되니 "
             "그 스텝은 버리고 스케일을 줄입니다.",
             "Small fp16 gradients flush to zero, so the loss is multiplied by a large number before backward and the "
             "gradients divided again before the step. Too large gives inf: drop that step and lower the scale."),
        Text("found_inf = 어느 p.grad에 inf/NaN이 있는가(torch.isfinite). 합의: flag = torch.tensor([float(found_inf)]); "
             "all_reduce(flag, MAX). update: 넘침 -> 스케일 × 0.5, 세기 0; 아니면 세기 +1, growth_interval이면 × 2, 세기 0.",
             "found_inf = whether any p.grad holds inf/NaN (torch.isfinite). Agree: flag = torch.tensor([float(found_inf)]); "
             "all_reduce(flag, MAX). update: overflow -> scale × 0.5, count 0; else count + 1, at growth_interval × 2 "
             "and count 0."),
        Text("상태: 스케일, 좋은 스텝 수, 이번 스텝의 found_inf. step()이 found_inf를 기억하고 update()가 그것을 읽습니다. unscale은 "
             "p.grad.div_(스케일)처럼 제자리에서.",
             "State: the scale, the count of good steps, this step's found_inf. step() remembers found_inf and update() "
             "reads it. Unscale in place, e.g. p.grad.div_(scale).")),
        [Case(Text("2 랭크, 스텝 2에서 랭크 1만 넘침(inf), growth_interval=2", "2 ranks, only rank 1 overflows (inf) at step 2, "
                   "growth_interval=2"), 2,
              {"seed": 91, "steps": 6, "init_scale": 8.0, "growth_interval": 2, "overflow": [(2, 1, INF)]}),
         Case(Text("3 랭크, 스텝 0에서 모두, 스텝 5에서 랭크 2만(NaN), growth_interval=3", "3 ranks, all overflow at step 0, "
                   "rank 2 alone at step 5 (NaN), growth_interval=3"), 3,
              {"seed": 92, "steps": 9, "init_scale": 1024.0, "growth_interval": 3,
               "overflow": [(0, 0, INF), (0, 1, NAN), (0, 2, INF), (5, 2, NAN)]}),
         Case(Text("2 랭크, 기본값(2^16, growth_interval=2000), 스텝 1에서 랭크 0만 넘침", "2 ranks, the defaults (2^16, "
                   "growth_interval=2000), rank 0 alone overflows at step 1"), 2,
              {"seed": 93, "steps": 3, "overflow": [(1, 0, INF)]})],
        _judge, uses="class", target="DynamicLossScaler"),
]
