"""Lab 02 exercise: a layer-wise split, forward and backward across ranks with send/recv.

Rank r holds consecutive layers (stage r). The activation goes forward r -> r+1, the gradient of
that activation comes back r+1 -> r; after one step every stage's parameter gradients must equal
the whole model's on one device, and the last rank returns the loss.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mpkit.exercises import harness
from mpkit.exercises.common import (NONE_GRAD, Case, Exercise, close, compare_grads, failed, grads, mismatch, passed,
                                    seeded)
from mpkit.exercises.result import Text

WIDTH, ROWS, BLOCKS = 8, 6, 4


def _model(seed, frozen_block):
    torch.manual_seed(seed)
    blocks = []
    for i in range(BLOCKS):
        block = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
        block.requires_grad_(i != frozen_block)
        blocks.append(block)
    return torch.nn.Sequential(*blocks)


def _data(seed):
    g = seeded(seed + 7)
    return torch.randn(ROWS, WIDTH, generator=g), torch.randn(ROWS, WIDTH, generator=g)


def _stage(model, rank, n):
    per = BLOCKS // n
    return model[rank * per:(rank + 1) * per]


def _body(ctx, recorder, fn, seed, frozen):
    stage = _stage(_model(seed, frozen), ctx.rank, ctx.world_size)
    x, y = _data(seed)
    last = ctx.rank == ctx.world_size - 1
    loss = recorder.call(fn, ctx, stage, x if ctx.rank == 0 else None, y if last else None, F.mse_loss,
                         (ROWS, WIDTH))
    if isinstance(loss, torch.Tensor):  # one number, or what else the learner returned, as a picture
        loss = loss.item() if loss.numel() == 1 else f"a tensor of shape {tuple(loss.shape)}"
    return {"loss": loss, "grads": grads(stage)}


def _judge(case, fn, timeout):
    n, seed, frozen = case.world_size, case.params["seed"], case.params["frozen"]
    outputs = harness.run(_body, n, (fn, seed, frozen), timeout)
    model = _model(seed, frozen)
    x, y = _data(seed)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    for rank, output in enumerate(outputs[:-1]):
        if output["out"]["loss"] is not None:
            return failed(case, Text(f"랭크 {rank}이(가) None이 아닌 {output['out']['loss']!r}을(를) 돌려주었습니다.",
                                     f"rank {rank} returned {output['out']['loss']!r}, not None."),
                          Text("손실은 마지막 랭크에만 있습니다: 다른 랭크는 None을 돌려주세요.",
                               "only the last rank has the loss: the other ranks return None."))
    got_loss = outputs[-1]["out"]["loss"]
    if not isinstance(got_loss, float) or not close(loss.detach(), torch.tensor(got_loss)):
        return failed(case, mismatch(Text(f"마지막 랭크({n - 1})가 돌려준 손실:", f"the loss the last rank ({n - 1}) returned:"),
                                     loss.detach(), torch.tensor(got_loss) if isinstance(got_loss, float) else got_loss),
                      Text("마지막 랭크는 loss_fn(출력, y)를 계산해 그 값(float 또는 텐서)을 돌려줘야 합니다.",
                           "the last rank computes loss_fn(output, y) and returns it (a float or a tensor)."))
    for rank in reversed(range(n)):
        got = outputs[rank]["out"]["grads"]
        want = grads(_stage(model, rank, n))
        problem = compare_grads(case, rank, want, got, n)
        if problem:
            if rank < n - 1 and all(v is None for v in got.values()):
                problem.hint = Text(f"랭크 {rank}에 그래디언트가 오지 않았습니다: 랭크 {rank + 1}은(는) 받은 활성값(requires_grad_()를 "
                                    f"켠 것)의 .grad를 랭크 {rank}에 보내고, 랭크 {rank}은(는) 그것을 받아 out.backward(grad)를 "
                                    "불러야 합니다.",
                                    f"no gradient reached rank {rank}: rank {rank + 1} must send the .grad of the "
                                    f"activation it received (made requires_grad_()) back to rank {rank}, which receives "
                                    "it and calls out.backward(grad).")
            return problem
    return passed(case)


STUB = '''def layerwise_step(ctx, stage, x, y, loss_fn, act_shape):
    """한 스텝의 순전파와 역전파. 랭크 r은 연속된 레이어 묶음 `stage`를 가집니다. 랭크 0만 `x`를, 마지막 랭크만 `y`를 받습니다
    (나머지는 None). 레이어 사이의 활성값과 그 그래디언트는 모양이 `act_shape`인 텐서입니다. 끝나면 `stage`의 `p.grad`가
    채워져 있어야 하고, 마지막 랭크는 손실을 돌려줍니다(다른 랭크는 None).
    One step's forward and backward. Rank r holds stage, a few consecutive layers. Only rank 0 gets x and only
    the last rank gets y (None elsewhere). Activations between ranks, and their gradients, have shape act_shape.
    Afterwards every stage's p.grad is filled; the last rank returns the loss (the others None)."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

EXERCISES = [
    Exercise("layerwise_step", "02", Text("레이어 단위 분할: 순전파와 역전파", "Layer-wise split: forward and backward"), STUB, (
        Text("순전파는 랭크 0 → 마지막 랭크로 활성값을, 역전파는 반대로 그 활성값의 그래디언트를 보냅니다.",
             "Forward sends activations rank 0 -> last; backward sends their gradients the other way."),
        Text("받은 활성값 a에 a.requires_grad_()를 켜야 역전파 뒤 a.grad가 생깁니다. 마지막이 아닌 랭크: out.backward(받은 그래디언트).",
             "Turn on a.requires_grad_() on a received activation so backward fills a.grad. Ranks other than the last "
             "call out.backward(received gradient)."),
        Text("r>0: a = torch.empty(act_shape); recv(a, r-1); a.requires_grad_()  (r=0: a = x)\nout = stage(a)\n"
             "마지막: loss = loss_fn(out, y); loss.backward()  아니면: send(out.detach(), r+1); g = empty; recv(g, r+1); "
             "out.backward(g)\nr>0: send(a.grad, r-1)",
             "r>0: a = torch.empty(act_shape); recv(a, r-1); a.requires_grad_()  (r=0: a = x)\nout = stage(a)\n"
             "last: loss = loss_fn(out, y); loss.backward()  else: send(out.detach(), r+1); g = empty; recv(g, r+1); "
             "out.backward(g)\nr>0: send(a.grad, r-1)")),
        [Case(Text("2 랭크", "2 ranks"), 2, {"seed": 11, "frozen": None}),
         Case(Text("4 랭크", "4 ranks"), 4, {"seed": 12, "frozen": None}),
         Case(Text("4 랭크, 랭크 1의 레이어 고정", "4 ranks, rank 1's layer frozen"), 4, {"seed": 13, "frozen": 1})],
        _judge, crash_hints=(("NoneType", Text("None을 보내려 했습니다: 받은 활성값에 requires_grad_()를 켜지 않으면 역전파 뒤에도 "
                                               ".grad가 None입니다.", "something sent or used is None: a received activation "
                                               "without requires_grad_() still has .grad None after backward.")),
                             ("implicitly created only for scalar", Text(
                                 "out.backward()에 받은 그래디언트를 넘기세요: 출력이 스칼라가 아니면 out.backward(grad)입니다.",
                                 "pass the received gradient: for a non-scalar output call out.backward(grad).")),
                             ("does not require grad", Text("역전파할 텐서가 그래디언트를 요구하지 않습니다: 받은 활성값에 "
                                                            "requires_grad_()를 켜세요.", "the tensor you backward through "
                                                            "needs no gradient: call requires_grad_() on the received "
                                                            "activation.")), NONE_GRAD)),
]
