"""What every exercise is made of, and the comparisons and messages the checkers share.

An ``Exercise`` is data: its name, the lab that teaches it, the stub the learner starts from, three
levels of hints, and its cases. Each case is one sub-check (worth its own points in nbgrader): a
world size and the sizes it runs, and a ``judge`` that runs the learner's code on the ranks
(``harness.run``) and compares what comes back with the single-device reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from mpkit.exercises import harness
from mpkit.exercises.result import CaseResult, Text

# float32 sums of a few terms in another order differ by a few ulps: 1e-5 relative to the
# tensor's size (absolute below 1) is far above that rounding and far below any real mistake.
TOL = 1e-5


@dataclass
class Case:
    name: Text
    world_size: int
    params: dict = field(default_factory=dict)


@dataclass
class Exercise:
    name: str
    lab: str
    title: Text
    stub: str            # the code cell the learner starts from (defines ``name``)
    hints: tuple         # three Text: a nudge, the formula, the structure
    cases: list
    judge: Callable      # judge(case, fn, timeout) -> CaseResult; may raise harness.Stuck / LearnerCrashed
    uses: str = "function"   # what ``check`` takes: "function", "class" or "pair" (two autograd Functions)
    crash_hints: tuple = ()  # (text in the learner's error, Text hint): classic mistakes that raise
    target: str = ""         # the expression ``check`` is given in a notebook (default: ``name``)

    def __post_init__(self):
        self.target = self.target or self.name


NONE_GRAD = ("NoneType", Text("어떤 텐서가 None입니다: 고정된(requires_grad=False) 파라미터의 p.grad는 None이니 건너뛰세요.",
                              "something is None: a frozen parameter (requires_grad=False) has p.grad None; skip it."))


def largest_difference(expected: torch.Tensor, got) -> float:
    """Max |expected - got|, or inf when ``got`` is no tensor of the same shape."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return float("inf")
    return (expected.double() - got.detach().double()).abs().max().item() if expected.numel() else 0.0


def close(expected: torch.Tensor, got, tol: float = TOL) -> bool:
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return False
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    return largest_difference(expected, got) <= tol * scale


def _values(t, start: int) -> str:
    flat = t.detach().reshape(-1)
    shown = ", ".join(f"{v:.4g}" for v in flat[start:start + 6].tolist())
    return ("..., " if start else "") + shown + (", ..." if flat.numel() > start + 6 else "")


def _short(t, start: int = 0) -> Text:
    if not isinstance(t, torch.Tensor):
        return Text(repr(t), repr(t))
    return Text(f"모양 {tuple(t.shape)} [{_values(t, start)}]", f"shape {tuple(t.shape)} [{_values(t, start)}]")


def first_difference(expected: torch.Tensor, got: torch.Tensor, tol: float = TOL) -> int:
    """The flat index of the first element that differs beyond ``tol`` (what a message shows first)."""
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    far = ((expected.double() - got.detach().double()).abs() > tol * scale).reshape(-1).nonzero()
    return int(far[0]) if len(far) else 0


def mismatch(where: Text, expected, got) -> Text:
    """"<where>: expected ... got ... (largest difference d)" — what a failing comparison says,
    starting at the first element that differs (with its index), not at identical leading values."""
    if isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor) and got.shape != expected.shape:
        return where + Text(f"모양이 {tuple(expected.shape)}이어야 하는데 {tuple(got.shape)}입니다.",
                            f"expected shape {tuple(expected.shape)}, got {tuple(got.shape)}.")
    if not isinstance(got, torch.Tensor):
        return where + Text(f"텐서를 기대했는데 {got!r}을(를) 받았습니다.", f"expected a tensor, got {got!r}.")
    d = largest_difference(expected, got)
    i = first_difference(expected, got)
    at = tuple(int(k) for k in torch.unravel_index(torch.tensor(i), expected.shape)) if expected.dim() > 1 else i
    first = (Text(f"처음 다른 원소는 인덱스 {at}:", f"first difference at index {at}:")
             if i or expected.numel() > 6 else Text("", ""))
    want, have = _short(expected, i), _short(got, i)
    return where + first + Text(f"기댓값 {want.ko}, 실제 {have.ko} (최대 차이 {d:.3g}).",
                                f"expected {want.en}, got {have.en} (largest difference {d:.3g}).")


def ratio(expected: torch.Tensor, got) -> float | None:
    """The one factor ``got = factor * expected`` when there is one (a missing or extra division),
    else None."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or not expected.abs().max() > 0:
        return None
    i = int(expected.abs().reshape(-1).argmax())
    factor = (got.detach().reshape(-1)[i] / expected.reshape(-1)[i]).item()
    return factor if close(expected * factor, got, 1e-4) else None


def factor_hint(factor: float | None, n: int, wanted: str = "average") -> Text | None:
    """Hints for results off by a factor of the world size, the classic division mistakes, told
    apart by what the exercise wants: the ``"average"`` over ranks or their ``"sum"``."""
    if factor is None:
        return None
    too_large = Text("결과가 정확히 world_size배입니다: 나누지 않은 합이거나, reduce를 한 번 더 했습니다.",
                     "the result is exactly world-size times too large: a sum never divided by the world size, or "
                     "one reduction too many.")
    too_small = (Text("결과가 world_size로 한 번 더 나뉘었습니다: 두 번 나누었거나, 평균을 낸 뒤 또 나누었습니다.",
                      "the result is divided by the world size once too often: divided twice, or an average divided "
                      "again.") if wanted == "average" else
                 Text("결과가 합이 아니라 평균입니다: 여기서는 world_size로 나누지 마세요.",
                      "the result is the average, not the sum: do not divide by the world size here."))
    squared = Text("결과가 world_size의 제곱배입니다: 같은 텐서를 두 번 합했습니다(예: 두 번 all-reduce).",
                   "the result is world-size squared times too large: the same tensor was summed twice (e.g. "
                   "all-reduced twice).")
    divided_twice = Text("결과가 world_size의 제곱으로 나뉘었습니다: 두 곳에서 나누었습니다(예: 역전파 두 군데에서 평균).",
                         "the result is divided by the world size squared: it was divided in two places (e.g. two "
                         "backward passes that average).")
    for value, hint in ((n, too_large), (1 / n, too_small), (n * n, squared), (1 / (n * n), divided_twice)):
        if abs(factor - value) <= 1e-3 * value:
            return hint
    return None


def _pure_body(ctx, recorder, fn, calls):
    return [recorder.call(fn, *args) for args in calls]


def pure_results(fn, calls, timeout):
    """``fn(*args)`` for each ``args`` of ``calls``, run on one watched rank (a function that needs
    no world: a formula, a plan), as the learner's code always runs: with its timeout."""
    return harness.run(_pure_body, 1, (fn, calls), timeout)[0]["out"]


def passed(case: Case, detail: Text | None = None) -> CaseResult:
    return CaseResult(case.name, True, detail or Text("", ""))


def failed(case: Case, detail: Text, hint: Text | None = None) -> CaseResult:
    return CaseResult(case.name, False, detail, hint)


def seeded(seed: int):
    """A generator for a case's data: every rank and the reference draw the same numbers."""
    return torch.Generator().manual_seed(seed)


def mlp(seed: int, sizes=(6, 8, 8, 3), frozen=(1,)):
    """A small Linear-Tanh stack made from ``seed`` (the same on every rank and in the reference);
    the Linear layers listed in ``frozen`` (0-based) have ``requires_grad=False``."""
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        linear = torch.nn.Linear(a, b)
        linear.requires_grad_(i not in frozen)
        layers += [linear, torch.nn.Tanh()] if i < len(sizes) - 2 else [linear]
    return torch.nn.Sequential(*layers)


def batch(seed: int, rows: int, features: int, classes: int):
    g = seeded(seed)
    return torch.randn(rows, features, generator=g), torch.randint(0, classes, (rows,), generator=g)


def grads(model) -> dict:
    """Each parameter's gradient (None for one that has none), detached copies."""
    return {name: None if p.grad is None else p.grad.detach().clone() for name, p in model.named_parameters()}


OWN_GRADIENT = Text("이 랭크 자신의 그래디언트 그대로입니다: 다른 랭크와 평균하지 않았습니다(통신이 없었거나, 다른 텐서나 복사본을 "
                    "all-reduce해서 p.grad에 제자리로(in place) 돌려놓지 않았습니다).",
                    "this is the rank's own gradient: it was never averaged with the others (no communication, or "
                    "another tensor or a copy was all-reduced and never put back into p.grad in place).")


TWICE = Text("그래디언트가 정확히 두 배입니다: 같은 그래디언트가 두 번 쌓였습니다(안쪽 역전파가 .grad에 쌓은 것을 backward가 또 "
             "돌려주었거나, 역전파를 두 번 했습니다).",
             "the gradient is exactly twice the right one: it was accumulated twice (an inner backward already added "
             "it to .grad and backward returned it again, or the backward ran twice).")


def compare_grads(case, rank, expected: dict, got: dict, n: int, local: dict | None = None, wanted="average"):
    """The first parameter whose gradient differs, as a failed CaseResult with the hint for the
    mistake it shows (a factor of the world size, a rank that kept its own gradient, a frozen
    parameter given one); None when all match."""
    for name, want in expected.items():
        have = got.get(name)
        where = Text(f"랭크 {rank}, 파라미터 '{name}'의 그래디언트:", f"rank {rank}, gradient of '{name}':")
        if want is None:
            if have is not None:
                return failed(case, where + Text("None이어야 합니다(고정된 파라미터).", "should stay None (a frozen parameter)."),
                              Text("requires_grad=False인 파라미터는 그래디언트가 없습니다(p.grad is None): 건너뛰고, 0으로 "
                                   "만들어 넣지 마세요.", "a parameter with requires_grad=False has no gradient (p.grad is "
                                   "None): skip it, do not make one up."))
            continue
        if have is None:
            return failed(case, where + Text("그래디언트가 없습니다(None).", "it is None."),
                          Text("역전파가 이 파라미터에 닿지 않았거나 그래디언트를 지웠습니다.",
                               "the backward never reached this parameter, or its gradient was cleared."))
        if not close(want, have):
            factor = ratio(want, have)
            hint = factor_hint(factor, n, wanted)
            if hint is None and factor is not None and n != 2 and abs(factor - 2) < 2e-3:
                hint = TWICE
            if hint is None and local is not None and local.get(name) is not None and close(local[name], have):
                hint = OWN_GRADIENT
            return failed(case, mismatch(where, want, have), hint)
    return None
