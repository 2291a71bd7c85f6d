"""A checker that cannot be fooled or bypassed (issues 41 and 46): collectives are seen however
they are called, mpkit's own mechanism does not pass for the learner's, values are judged as plain
tensors, nothing a learner starts outlives a check, and messages never name the checker's process
as a learner's rank. Each test is one or two checks of a real exercise (a few launches)."""
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed import P2POp, all_reduce, batch_isend_irecv, irecv, isend  # imported before any check

from mpkit import exercises
from mpkit.exercises import harness

pytestmark = pytest.mark.timeout(120)


def check(name, fn):
    return exercises.check(name, fn, lang="en", record=False)


# ---- 1. every way of calling a collective is recorded ----

def imported_all_reduce(ctx, tensor):
    all_reduce(tensor)  # torch.distributed's function, bound before the recorder was installed
    return tensor


def group_all_reduce(ctx, tensor):
    dist.group.WORLD.allreduce([tensor]).wait()  # the ProcessGroup object itself
    return tensor


def batched_ring(ctx, tensor):
    """A correct ring written with batch_isend_irecv and P2POps (torch 2.13's P2POp: group_peer)."""
    n, r = ctx.world_size, ctx.rank
    chunks = list(tensor.view(-1).tensor_split(n))
    for phase in (0, 1):
        for step in range(n - 1):
            out, into = (r - step + phase) % n, (r - step - 1 + phase) % n
            buf = torch.empty_like(chunks[into])
            for work in batch_isend_irecv([P2POp(isend, chunks[out].clone(), (r + 1) % n),
                                           P2POp(irecv, buf, (r - 1) % n)]):
                work.wait()
            if phase == 0:
                chunks[into] += buf
            else:
                chunks[into].copy_(buf)
    return tensor


def test_collectives_are_recorded_however_they_are_called():
    for fn in (imported_all_reduce, group_all_reduce):
        result = check("ring_all_reduce", fn)
        assert not result.passed and "called all_reduce" in result.message, result.message
    result = check("ring_all_reduce", batched_ring)
    assert result.passed, result.message


class ImportedBucketSync:
    """A correct bucketed sync whose all_reduce was imported with ``from torch.distributed import``."""

    def __init__(self, ctx, model, bucket_mb):
        self.n, limit, size = ctx.world_size, bucket_mb * 2**20, 0
        self.buckets = [[]]
        for p in reversed([p for p in model.parameters() if p.requires_grad]):
            if self.buckets[-1] and size + p.numel() * 4 > limit:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * 4
        self.left = {}
        self.works = []
        for bucket in self.buckets:
            for p in bucket:
                p.register_post_accumulate_grad_hook(lambda p, bucket=bucket: self._ready(bucket))

    def _ready(self, bucket):
        key = id(bucket)
        self.left[key] = self.left.get(key, len(bucket)) - 1
        if self.left[key] == 0:
            flat = torch.cat([q.grad.reshape(-1) for q in bucket])
            self.works.append((bucket, flat, all_reduce(flat, async_op=True)))

    def finish(self):
        for bucket, flat, work in self.works:
            work.wait()
            flat /= self.n
            for q, piece in zip(bucket, flat.split([q.numel() for q in bucket])):
                q.grad.copy_(piece.view_as(q))
        self.left, self.works = {}, []


def test_an_imported_all_reduce_counts_in_the_bucketed_exercise():
    result = check("bucketed_gradients", ImportedBucketSync)
    assert result.passed, result.message


def test_calls_carry_global_peers_and_blocking():
    def body(ctx, recorder):
        def fn():
            sub = dist.new_group([1, 2])   # group ranks 0, 1 are global ranks 1, 2
            t = torch.ones(3)
            if ctx.rank == 1:
                dist.send(t, group=sub, group_dst=1)
            elif ctx.rank == 2:
                dist.recv(t, group=sub, group_src=0)
            dist.all_reduce(t, async_op=True).wait()
        recorder.call(fn)

    calls = [[(c.kind, c.peer, c.numel, c.blocking) for c in o["calls"]] for o in harness.run(body, 3)]
    assert calls[1] == [("send", 2, 3, True), ("all_reduce", None, 3, False)]
    assert calls[2] == [("recv", 1, 3, True), ("all_reduce", None, 3, False)]


# ---- 2. mpkit's own mechanism is not the learner's ----

def parallel_ring(ctx, tensor):
    from mpkit.parallel.collectives import ring_all_reduce
    return ring_all_reduce(tensor)


def caught_solution(ctx, tensor):
    """Catches the refusal and computes the result with mpkit's reference anyway."""
    from mpkit.exercises import solutions
    try:
        return solutions.ring_all_reduce(ctx, tensor)
    except Exception:  # noqa: BLE001 - the learner's hostile try
        return tensor


def test_mpkit_reference_code_does_not_pass():
    for fn, where in ((parallel_ring, "mpkit/parallel/collectives.py"),
                      (caught_solution, "ring_all_reduce (mpkit/exercises/solutions.py)")):
        result = check("ring_all_reduce", fn)
        assert not result.passed and "your code calls mpkit's own" in result.message and where in result.message, \
            result.message
        assert "mpkit에 이미 있는" in result.case(0).message("ko")


def test_mpkit_reference_solution_given_to_check_does_not_pass(monkeypatch):
    """A notebook's ``from mpkit.exercises.solutions import ...`` (mpkit's own tests trust it)."""
    from mpkit.exercises import solutions
    monkeypatch.delenv("MPKIT_EXERCISES_TRUST_REFERENCE", raising=False)
    result = check("loss_scaler", solutions.DynamicLossScaler)
    assert not result.passed and "DynamicLossScaler (mpkit/exercises/solutions.py)" in result.message, result.message


def pure_reference(rank, p, m):
    """A schedule computed by mpkit's reference, with no communication at all."""
    from mpkit.exercises.solutions import one_f_one_b_schedule
    return one_f_one_b_schedule(rank, p, m)


def test_a_result_computed_by_mpkit_without_communication_does_not_pass():
    result = check("one_f_one_b_schedule", pure_reference)
    assert not result.passed and "one_f_one_b_schedule (mpkit/exercises/solutions.py)" in result.message, \
        result.message


# ---- 3. values are judged as plain tensors ----

class Liar(torch.Tensor):
    """Says it is close to anything: every comparison and subtraction answers "equal"."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("sub", "__sub__", "allclose", "equal", "eq", "__eq__", "isclose"):
            return torch.zeros(()) if name in ("sub", "__sub__") else True
        return super().__torch_function__(func, types, args, kwargs or {})


def lying_average(ctx, model):
    """Never communicates: each gradient becomes a zero tensor that claims to equal anything."""
    for p in model.parameters():
        if p.grad is not None:
            p.grad = torch.zeros_like(p.grad).as_subclass(Liar)


def test_a_lying_tensor_subclass_does_not_pass():
    result = check("average_gradients", lying_average)
    assert not result.passed, result.message
    out = harness.plain({"a": [torch.ones(2).as_subclass(Liar)], "n": type("N", (int,), {"__eq__": lambda s, o: True})(3)})
    assert type(out["a"][0]) is torch.Tensor and type(out["n"]) is int and out["n"] != 4


# ---- 4. nothing outlives a check ----

def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers and /proc are Linux's")
def test_children_in_a_new_session_do_not_outlive_the_check(tmp_path):
    pids = tmp_path / "pids"

    def escaping(ctx, tensor):
        """Starts a sleeper in a session of its own and a double-forked one, then raises on rank 1."""
        child = subprocess.Popen(["sleep", "60"], start_new_session=True)
        double = subprocess.run(["sh", "-c", "setsid sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True,
                                text=True).stdout.strip()
        with open(pids, "a") as f:
            f.write(f"{child.pid}\n{double}\n")
        if ctx.rank == 1:
            raise ValueError("a learner's mistake")
        return solution_free_sum(tensor)

    result = check("ring_all_reduce", escaping)
    assert not result.passed
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) >= 4
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in started if _alive(p)]
    assert not left, [(p, open(f"/proc/{p}/stat").read(), open(f"/proc/{p}/cmdline").read()) for p in left]


def solution_free_sum(tensor):
    return tensor


# ---- 5. the checker's process is no learner's rank; deadlocks name what each rank waits in ----

def endless_schedule(rank, p, m):
    while True:
        pass


def both_send_first(ctx, tensor):
    peer = (ctx.rank + 1) % ctx.world_size
    dist.send(tensor, peer)
    dist.recv(tensor, peer)
    return tensor


def test_messages_name_no_checker_rank_and_what_each_rank_waits_in():
    loop = exercises.check("gpipe_schedule", endless_schedule, lang="en", record=False, timeout=2)
    assert "your code was still running" in loop.message and "rank 0" not in loop.message, loop.message
    stuck = exercises.check("ring_all_reduce", both_send_first, lang="en", record=False, timeout=3)
    assert "rank 0: send to rank 1 (8 elements), waiting" in stuck.message, stuck.message
    ko = stuck.case(0).message("ko")
    assert "랭크 0: send 랭크 1에게 (원소 8개)에서 기다리는 중" in ko and "waiting" not in ko, ko


def test_functional_collectives_are_recorded_too():
    import torch.distributed._functional_collectives as funcol

    def functional_ring(ctx, tensor):
        tensor.copy_(funcol.all_reduce(tensor, "sum", dist.group.WORLD))
        return tensor

    result = check("ring_all_reduce", functional_ring)
    assert not result.passed and "called all_reduce" in result.message, result.message
