"""Lab 06 §7 exercise: activation checkpointing of one block, written by hand.

``checkpoint_block(block, x)`` must return ``block(x)`` while keeping nothing of the block for
backward but its input, then run the block's forward again inside the backward and backpropagate
through it, with the RNG state of the first forward restored so that dropout draws the same mask.
One process; the block is Linear-GELU-Dropout-Linear, 8 -> 32 -> 8.

Checked: the output, the block's parameter gradients and x's gradient equal an ordinary
forward/backward from the same seed; what the call leaves saved for backward (``held``: saved
tensors and the autograd contexts, by storage, parameters and RNG states left out) is at most
the input's bytes; and neither ``torch.utils.checkpoint`` nor mpkit's ``recompute_layers`` (built
on it) did the work.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.utils.checkpoint as torch_checkpoint

from mpkit.exercises import harness
from mpkit.exercises.common import Case, Exercise, compare_grads, failed, grads, mismatch, passed, close
from mpkit.exercises.held import Held
from mpkit.exercises.result import Text

WIDTH, HIDDEN = 8, 32


def _block(seed, dropout, frozen):
    torch.manual_seed(seed)
    block = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.GELU(), torch.nn.Dropout(dropout),
                                torch.nn.Linear(HIDDEN, WIDTH))
    block[0].requires_grad_(not frozen)
    return block


def _inputs(seed, rows, grad):
    g = torch.Generator().manual_seed(seed + 1)
    x, weights = torch.randn(rows, WIDTH, generator=g), torch.randn(rows, WIDTH, generator=g)
    return x.requires_grad_(grad), weights


def _block_input(leaf, p):
    """What the block gets: the leaf itself, or (``history``) an earlier layer's output ``2·leaf``, as
    inside a model: a recomputation on that x itself (not ``x.detach()``) runs into the graph before
    the block."""
    return leaf * 2.0 if p.get("history") else leaf


@contextmanager
def _watch_library(used: list):
    """Note whether torch's checkpoint (reentrant or not) runs: both paths look these names up in
    their module when called, so a learner's earlier ``from torch.utils.checkpoint import
    checkpoint`` is seen too."""
    reentrant, plain = torch_checkpoint.CheckpointFunction, torch_checkpoint._checkpoint_without_reentrant_generator

    class Watched(reentrant):
        @staticmethod
        def forward(ctx, *args):
            used.append("torch.utils.checkpoint")
            return reentrant.forward(ctx, *args)

    def watched(*args, **kwargs):
        used.append("torch.utils.checkpoint")
        return plain(*args, **kwargs)
    torch_checkpoint.CheckpointFunction, torch_checkpoint._checkpoint_without_reentrant_generator = Watched, watched
    try:
        yield
    finally:
        torch_checkpoint.CheckpointFunction, torch_checkpoint._checkpoint_without_reentrant_generator = reentrant, plain


def _body(ctx, recorder, fn, p):
    block, (leaf, weights) = _block(p["seed"], p["dropout"], p["frozen"]), _inputs(p["seed"], p["rows"], p["x_grad"])
    x = _block_input(leaf, p)
    used = []
    with _watch_library(used):
        torch.manual_seed(p["seed"] + 2)
        with Held() as held:
            out = recorder.call(fn, block, x)
        kept = held.storages(out, before=[*block.parameters()], stop=x)
        held.release()
        torch.rand(4)  # the rest of the model draws between forward and backward (later layers' dropout)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            recorder.call((out * weights).sum().backward)
    return {"out": out.detach() if isinstance(out, torch.Tensor) else out, "grads": grads(block),
            "x_grad": leaf.grad, "held": sum(kept.values()), "used": used, "next_draw": torch.rand(4)}


def _reference(p):
    block, (leaf, weights) = _block(p["seed"], p["dropout"], p["frozen"]), _inputs(p["seed"], p["rows"], p["x_grad"])
    torch.manual_seed(p["seed"] + 2)
    out = block(_block_input(leaf, p))
    torch.rand(4)
    (out * weights).sum().backward()
    return out.detach(), grads(block), leaf.grad, torch.rand(4)


def _another_mask(p):
    """The parameter gradients when the recomputation draws the next dropout mask (RNG not restored)."""
    block, (x, weights) = _block(p["seed"], p["dropout"], p["frozen"]), _inputs(p["seed"], p["rows"], p["x_grad"])
    torch.manual_seed(p["seed"] + 2)
    with torch.no_grad():
        block(x)
    torch.rand(4)  # as _body draws between forward and backward
    (block(x.detach()) * weights).sum().backward()
    return grads(block)


NOT_DETACHED = Text("다시 계산을 저장한 x 그대로에서 했습니다: x가 앞 레이어의 출력이면 그 그래프까지 두 번째로 역전파합니다. "
                    "x.detach().requires_grad_()에서 다시 계산하고 그 입력의 그래디언트를 돌려주세요.",
                    "the recomputation ran on the saved x itself (not x.detach()): when x is an earlier layer's output, "
                    "the inner backward runs into that layer's graph a second time. Recompute on "
                    "x.detach().requires_grad_() and return that input's gradient.")
NO_GRAD_OUTPUT = Text("블록의 출력이 그래디언트를 요구하지 않습니다: 입력 x가 requires_grad=False이면(데이터에서 바로 온 첫 블록) "
                      "autograd Function의 출력도 그렇습니다. 블록의 파라미터도 Function의 입력으로 넘기거나, 출력이 파라미터에 "
                      "의존하게 하세요.",
                      "the block's output does not require grad: when x has requires_grad=False (a first block, fed "
                      "from data) the output of an autograd Function does not either. Pass the block's parameters to "
                      "the Function as inputs too, so the output depends on them.")
RNG = Text("출력은 맞는데 그래디언트가 다릅니다: 역전파 때 다시 계산한 순전파에서 dropout이 다른 마스크를 뽑았습니다. 순전파 전에 "
           "torch.get_rng_state()를 저장하고, 다시 계산하기 전에 torch.random.fork_rng() 안에서 torch.set_rng_state()로 "
           "되돌리세요.",
           "the output is right but the gradients differ: the forward recomputed in backward drew another dropout mask. "
           "Save torch.get_rng_state() before the forward and restore it with torch.set_rng_state() inside "
           "torch.random.fork_rng() before recomputing.")


def _judge(case, fn, timeout):
    p = case.params
    got = harness.run(_body, 1, (fn, p), timeout)[0]["out"]
    if got["used"]:
        return failed(case, Text("torch.utils.checkpoint가 일을 했습니다.", "torch.utils.checkpoint did the work."),
                      Text("이 연습은 체크포인팅을 직접 만드는 것입니다: torch.utils.checkpoint나 mpkit의 recompute_layers 없이, "
                           "torch.autograd.Function으로 쓰세요.",
                           "this exercise builds checkpointing itself: write it as a torch.autograd.Function, without "
                           "torch.utils.checkpoint or mpkit's recompute_layers."))
    out, want_grads, x_grad, next_draw = _reference(p)
    if not close(out, got["out"]):
        return failed(case, mismatch(Text("블록의 출력:", "the block's output:"), out, got["out"]),
                      Text("순전파는 block(x)를 한 번, 평소대로 계산해 돌려줘야 합니다(그래디언트 기록만 하지 않고).",
                           "the forward must compute block(x) once, as usual, and return it (only without recording "
                           "for autograd)."))
    if got["grads"] and all(g is None for g in got["grads"].values()) and any(g is not None for g in want_grads.values()):
        return failed(case, Text("블록의 파라미터에 그래디언트가 없습니다.", "the block's parameters got no gradient."),
                      NO_GRAD_OUTPUT if not p["x_grad"] else
                      Text("역전파에서 블록을 다시 실행한 뒤 그 출력으로 torch.autograd.backward(출력, grad)를 불러야 파라미터에 "
                           "그래디언트가 쌓입니다.", "after recomputing the block in backward, call "
                           "torch.autograd.backward(output, grad) on it so the parameters get their gradients."))
    problem = compare_grads(case, 0, want_grads, got["grads"], 1)
    if problem:
        if p["dropout"] and compare_grads(case, 0, _another_mask(p), got["grads"], 1) is None:
            problem.hint = RNG
        return problem
    if x_grad is not None and not close(x_grad, got["x_grad"]):
        return failed(case, mismatch(Text("x의 그래디언트:", "x's gradient:"), x_grad, got["x_grad"]),
                      Text("backward는 다시 계산한 순전파의 입력(x.detach().requires_grad_())에 쌓인 그래디언트를 돌려줍니다.",
                           "backward returns the gradient accumulated in the recomputed forward's input "
                           "(x.detach().requires_grad_())."))
    if p["dropout"] and not torch.equal(next_draw, got["next_draw"]):
        return failed(case, Text("값은 맞지만 역전파 뒤의 난수가 체크포인팅 없는 실행과 다릅니다: 전역 난수 흐름이 "
                                 "되감겼습니다.", "the values are right but the random numbers drawn after the backward differ "
                                 "from a run without checkpointing: the global random stream was rewound."),
                      Text("set_rng_state로 상태를 되돌린 채 두면 다음 dropout 마스크가 이미 쓴 것을 되풀이합니다: 다시 계산은 "
                           "torch.random.fork_rng() 안에서 하세요(끝나면 원래 흐름으로 돌아옵니다).",
                           "restoring the state with set_rng_state and leaving it there makes later dropout masks repeat "
                           "ones already used: recompute inside torch.random.fork_rng(), which puts the stream back "
                           "afterwards."))
    target = p["rows"] * WIDTH * 4
    if got["held"] > target:
        return failed(case, Text(f"순전파와 역전파 사이에 {got['held']} B를 저장했습니다. 목표: 블록의 입력만, {target} B.",
                                 f"{got['held']} B were saved between forward and backward; target: the block's input "
                                 f"only, {target} B."),
                      Text("autograd가 기록하는 순전파는 블록 안의 활성값(GELU 입력, dropout 마스크, 둘째 Linear의 입력)을 모두 "
                           "저장합니다: 순전파는 torch.no_grad() 안에서 하고 ctx.save_for_backward(x)만 남기세요.",
                           "a forward that autograd records saves every activation inside the block (GELU's input, "
                           "the dropout mask, the second Linear's input): run the forward under torch.no_grad() and "
                           "keep only ctx.save_for_backward(x)."))
    return passed(case, Text(f"저장한 것 {got['held']} B(목표 {target} B 이하)", f"saved {got['held']} B (target at most {target} B)"))


STUB = '''def checkpoint_block(block, x):
    """활성값 체크포인팅(activation checkpointing): block(x)를 돌려주되, 역전파용으로 블록 안의 활성값은 저장하지 않고 입력 x만
    남깁니다. 역전파 때 블록의 순전파를 다시 실행해 그것으로 역전파합니다. dropout이 같은 마스크를 뽑도록 첫 순전파의 RNG 상태를
    되돌리세요. x는 그래디언트를 요구하지 않을 수도 있고(데이터에서 온 첫 블록), 블록에는 고정된 파라미터가 있을 수 있습니다.
    목표: 순전파와 역전파 사이에 저장하는 것은 x의 바이트까지(블록 안의 활성값 0). torch.utils.checkpoint는 쓰지 않습니다.
    Activation checkpointing: return block(x) but keep nothing inside the block for backward, only the input x; in
    backward, run the block's forward again and backpropagate through it, with the RNG state of the first forward
    restored so dropout draws the same mask. x may not require grad (a first block, fed from data) and the block
    may have frozen parameters. Target: at most x's bytes saved between forward and backward (no activation of
    the block). Do not use torch.utils.checkpoint."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

EXERCISES = [
    Exercise("checkpoint_block", "06", Text("블록의 활성값 체크포인팅", "Activation checkpointing of a block"), STUB, (
        Text("역전파에 필요한 활성값을 저장하는 대신 입력만 저장하고, 필요할 때 순전파를 한 번 더 합니다: 메모리를 계산과 맞바꿉니다.",
             "Instead of the activations backward needs, keep only the input and run the forward once more when they "
             "are needed: memory traded for compute."),
        Text("torch.autograd.Function: forward는 torch.no_grad()로 block(x)(아무것도 기록 안 함), backward는 "
             "torch.enable_grad()로 x.detach().requires_grad_()에 block을 다시 실행하고 torch.autograd.backward(출력, grad). "
             "RNG: torch.get_rng_state() / torch.set_rng_state().",
             "A torch.autograd.Function: forward runs block(x) under torch.no_grad() (nothing recorded); backward reruns "
             "block on x.detach().requires_grad_() under torch.enable_grad() and calls torch.autograd.backward(output, "
             "grad). RNG: torch.get_rng_state() / torch.set_rng_state()."),
        Text("Function의 입력: (x, *파라미터) — 그래야 x가 그래디언트를 요구하지 않아도 출력이 파라미터에 이어집니다. forward: 상태 "
             "저장, 계산, save_for_backward(x). backward: fork_rng 안에서 상태 복원, 다시 계산, 역전파, (x의 그래디언트, 파라미터마다 "
             "None)을 돌려주기 — 파라미터의 그래디언트는 안쪽 역전파가 이미 쌓았습니다.",
             "The Function's inputs: (x, *parameters), so the output hangs on the parameters even when x needs no "
             "gradient. forward: keep the RNG state, compute, save_for_backward(x). backward: inside fork_rng restore the "
             "state, recompute, backpropagate, return (x's gradient, None per parameter): the inner backward already "
             "accumulated the parameters' gradients.")),
        [Case(Text("dropout 없음, x가 그래디언트를 요구함", "no dropout, x requires grad"), 1,
              {"seed": 101, "rows": 5, "dropout": 0.0, "x_grad": True, "frozen": False}),
         Case(Text("dropout 0.5: 같은 마스크", "dropout 0.5: the same mask"), 1,
              {"seed": 102, "rows": 6, "dropout": 0.5, "x_grad": True, "frozen": False}),
         Case(Text("데이터에서 온 x(requires_grad=False), 고정된 첫 Linear, dropout 0.3",
                   "x from data (requires_grad=False), the first Linear frozen, dropout 0.3"), 1,
              {"seed": 103, "rows": 4, "dropout": 0.3, "x_grad": False, "frozen": True}),
         Case(Text("x는 앞 레이어의 출력(자기 그래프가 있음), dropout 0.2",
                   "x is an earlier layer's output (it has a graph of its own), dropout 0.2"), 1,
              {"seed": 104, "rows": 3, "dropout": 0.2, "x_grad": True, "frozen": False, "history": True})],
        _judge, crash_hints=(("does not require grad and does not have a grad_fn", NO_GRAD_OUTPUT),
                             ("backward through the graph a second time", NOT_DETACHED))),
]
