"""Feedback that points at the mistake, and correct that is not right (issue 41), checked on the
checker's own pieces without launching a world, but for one launch (the nbgrader stub):

* cost: a 1F1B with no overlap fails naming 1F1B's bubble and the measured one; a ZeRO-1 step
  with two full all-reduces fails naming its bytes against one reduce-scatter + one all-gather;
* a wrong signature is named before anything runs; an exception gets its likely cause;
* a mismatch shows the first element that differs, with its index;
* the ring's mistakes get hints that name them (five traces, not one chunk-index hint); the Megatron MLP's mistakes between the layers
  are named (a bias slice is not blamed on the GeLU); a collective some ranks never call is not
  called a send/recv deadlock;
* an nbgrader hidden test on an untouched stub fails with "not done yet", not an IndexError.
"""
import re
import time

import torch
import torch.nn.functional as F

from mpkit.exercises import EXERCISES, check, harness
from mpkit.exercises.assignment import exercise_cells
from mpkit.exercises.checker import _stuck_hint, crash_hint
from mpkit.exercises.collectives import _value_hint
from mpkit.exercises.common import Case, mismatch
from mpkit.exercises.pipeline import _one_f_one_b_property
from mpkit.exercises.result import Text
from mpkit.exercises.tensor_parallel import _output_hint, _weights
from mpkit.exercises.zero import _bytes_problem
from mpkit.parallel.pipeline.schedules import (Backward, Forward, OptimizerStep, RecvAct, RecvGrad, SendAct,
                                               SendGrad, simulate)

CASE = Case(Text("경우", "case"), 4, {})


def _no_overlap(rank, p, m):
    """F_k B_k for every micro-batch: valid values, one activation held, no pipelining at all."""
    prog = []
    for mb in range(m):
        prog += ([RecvAct(mb, rank, rank - 1)] if rank else []) + [Forward(mb, rank)] + \
            ([SendAct(mb, rank, rank + 1)] if rank < p - 1 else [])
        prog += ([RecvGrad(mb, rank, rank + 1)] if rank < p - 1 else []) + [Backward(mb, rank)] + \
            ([SendGrad(mb, rank, rank - 1)] if rank else [])
    return prog + [OptimizerStep()]


def test_1f1b_without_overlap_fails_naming_the_target_and_the_measured_bubble():
    programs = [_no_overlap(r, 4, 8) for r in range(4)]
    problem = _one_f_one_b_property(CASE, programs, simulate(programs), 4, 8)
    assert problem is not None and not problem.passed
    assert "75.0%" in problem.detail("en") and "27.3%" in problem.detail("en") and "(p-1)/(m+p-1)" in problem.detail("en")
    assert "warm-up" in problem.hint("en")


def test_zero1_with_two_full_all_reduces_fails_naming_its_bytes():
    n, numel, steps = 4, 10, 3
    two_all_reduces = [harness.Call("all_reduce", None, numel, 4, None, True)] * (2 * steps)
    problem = _bytes_problem(Case(Text("", ""), n, {}), [{"calls": two_all_reduces}] * n, numel)
    text = problem.detail("en")
    assert "120 B per step" in text and "72 B" in text and "2x" in text, text   # 2·2(N-1)/N·S against 2(N-1)·⌈S/N⌉
    ring = [harness.Call("reduce_scatter_tensor", None, 3, 4, None, True),   # the recorder sees the output shard
            harness.Call("all_gather_into_tensor", None, 12, 4, None, True)] * steps
    assert _bytes_problem(Case(Text("", ""), n, {}), [{"calls": ring}] * n, numel) is None


def test_wrong_signature_is_named_before_anything_runs():
    def ring_all_reduce(tensor, group):
        raise AssertionError("must not run")
    started = time.monotonic()
    result = check("ring_all_reduce", ring_all_reduce, lang="en", record=False)
    assert time.monotonic() - started < 2 and not result.passed
    assert "the exercise calls ring_all_reduce(ctx, tensor); yours, ring_all_reduce, takes (tensor, group)" in result.message
    assert "(tensor, group)" in check("ring_all_reduce", ring_all_reduce, record=False).message   # Korean too


def test_an_exception_gets_a_hint_about_its_likely_cause():
    exercise = EXERCISES["ring_all_reduce"]
    for error, word in (("RuntimeError: The size of tensor a (3) must match the size of tensor b (2)", "shape"),
                        ("RuntimeError: expected scalar type Float but found Long", "dtype"),
                        ("ValueError: Invalid process group specified", "group"),
                        ("IndexError: tuple index out of range", "(rank ± 1) % world_size"),
                        ("TypeError: f() takes 2 positional arguments but 3 were given", "signature"),
                        ("RuntimeError: Boolean value of Tensor with more than one value is ambiguous", "order"),
                        ("AttributeError: 'NoneType' object has no attribute 'add_'", "None"),
                        ("ZeroDivisionError: division by zero", "last line")):
        hint = crash_hint(exercise, f'  File "<cell>", line 3, in ring_all_reduce\n{error}')
        assert word in hint("en"), (error, hint("en"))


def test_a_mismatch_starts_at_the_first_element_that_differs():
    expected = torch.arange(20.0)
    got = expected.clone()
    got[15] += 1
    text = mismatch(Text("랭크 0:", "rank 0:"), expected, got)
    assert "first difference at index 15" in text("en") and "[..., 16, 16, 17" in text("en")
    assert "인덱스 15" in text("ko") and "shape" not in text("ko")


def _ring(inputs, mistake):
    """Rank 0's tensor after a ring all-reduce written with ``mistake``, simulated in one process."""
    n = len(inputs)
    chunks = [list(x.clone().tensor_split(n)) for x in inputs]
    steps = n - 2 if mistake == "too_few_steps" else n - 1
    for k in range(steps):  # reduce-scatter: rank r sends chunk (r-k) % n, adds into (r-k-1) % n
        sent = [chunks[r][(r - k) % n].clone() for r in range(n)]
        for r in range(n):
            into = (r - k - 1) % n if mistake != "wrong_index" else (r - k) % n
            if mistake == "replaces":
                chunks[r][into] = sent[(r - 1) % n].clone()
            elif mistake == "overwritten":
                chunks[r][into] = chunks[r][into] * 0.5 + sent[(r - 1) % n]
            else:
                chunks[r][into] = chunks[r][into] + sent[(r - 1) % n]
    if mistake != "no_all_gather":
        for k in range(n - 1):  # all-gather: rank r sends its finished chunk (r+1-k) % n
            sent = [chunks[r][(r + 1 - k) % n].clone() for r in range(n)]
            for r in range(n):
                into = (r - k) % n
                chunks[r][into] = chunks[r][into] + sent[(r - 1) % n] if mistake == "gather_adds" else sent[(r - 1) % n]
    return torch.cat(chunks[0])


def test_ring_mistakes_get_hints_that_name_them():
    inputs = [torch.randn(8, generator=torch.Generator().manual_seed(r)) for r in range(4)]
    expected = torch.stack(inputs).sum(0)
    assert torch.allclose(_ring(inputs, None), expected, atol=1e-5)   # the simulation itself is a ring
    lacks = expected.clone()
    lacks[:2] -= inputs[2][:2]   # chunk 0 without rank 2's part: a value added into the wrong chunk
    hints = {}
    for mistake, got, phrase in (("too_few_steps", _ring(inputs, "too_few_steps"), "a step short"),
                                 ("replaces", _ring(inputs, "replaces"), "replaced the sum"),
                                 ("gather_adds", _ring(inputs, "gather_adds"), "counts rank(s) [0] twice"),
                                 ("overwritten", _ring(inputs, "overwritten"), "no sum of the inputs"),
                                 ("no_all_gather", _ring(inputs, "no_all_gather"), "all-gather phase"),
                                 ("wrong_chunk", lacks, "lacks rank(s) [2]")):
        hint = _value_hint("all_reduce", 4, 0, expected, got, inputs)("en")
        assert phrase in hint, (mistake, hint)
        hints[mistake] = hint
    assert len(set(hints.values())) >= 5   # too few steps and replacing leave the same trace: one hint names both


def test_megatron_mistakes_between_the_layers_are_named():
    w = _weights(21)
    x, w1, b1, w2, b2 = (w[k] for k in ("x", "w1", "b1", "w2", "b2"))
    for got, phrase in ((F.linear(F.gelu(F.linear(x, w1)), w2, b2), "up_bias) is missing"),
                        (F.linear(F.gelu(F.linear(x, w1)) + b1, w2, b2), "after the GeLU"),
                        (F.linear(F.gelu(F.linear(x, w1, b1)), w2), "down_bias) is missing"),
                        (F.linear(F.linear(x, w1, b1), w2, b2), "GeLU is missing"),
                        (F.linear(F.gelu(F.linear(x, w1, b1 * 0.5)), w2, b2), "check each step")):
        assert phrase in _output_hint(21, 2, got)("en")


def test_a_collective_some_ranks_never_call_is_not_a_send_recv_deadlock():
    stuck = harness.Stuck({0: "all_reduce (8 elements), waiting", 1: harness.RETURNED})
    hint = _stuck_hint(stuck)
    assert "all_reduce" in hint("en") and "ranks [1]" in hint("en") and "not a send/recv" in hint("en")
    assert "isend" in _stuck_hint(harness.Stuck({0: "recv from rank 1 (8 elements), waiting",
                                                 1: "recv from rank 0 (8 elements), waiting"}))("en")


def test_an_untouched_nbgrader_stub_scores_zero_with_not_done_yet():
    def memory_per_gpu(params, dp, pp, tp, zero_stage):
        # YOUR CODE HERE
        raise NotImplementedError()
    namespace = {"memory_per_gpu": memory_per_gpu, "exercises": __import__("mpkit.exercises").exercises}
    cells = [c.source for c in exercise_cells("memory_per_gpu", "en") if "HIDDEN" in c.source]
    failures = []
    for source in cells:
        try:
            exec(source.replace("### BEGIN HIDDEN TESTS", "").replace("### END HIDDEN TESTS", ""), namespace)
        except AssertionError as err:
            failures.append(str(err))
    assert len(failures) == len(cells) == len(EXERCISES["memory_per_gpu"].cases)
    assert all("not done yet" in f for f in failures), failures


def test_case_names_in_korean_have_no_english_words():
    for name, exercise in EXERCISES.items():
        for case in exercise.cases:
            assert not re.search(r"\b(rank|ranks|shape|world size)\b", case.name("ko")), (name, case.name("ko"))
