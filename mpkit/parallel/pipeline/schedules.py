"""Pipeline schedules as data (ShallowSpeed / LLM-Training-Puzzles style): one instruction list per rank.

The algorithm in ~20 lines. With p ranks and m micro-batches, a schedule is only an *order* of
computations per rank; ``schedule`` then adds the messages around them:

    gpipe (Huang et al. 2019)       every forward, then every backward: F0 F1 .. Fm-1 B0 .. Bm-1
    1f1b (PipeDream-Flush)          rank r: p-1-r warm-up forwards, then one F and one B in turn,
                                    then the B left; at most p-r micro-batches' activations alive
    interleaved (Megatron 2021)     v chunks per rank (stage s on rank s % p); 1F1B over the chunks,
                                    micro-batches in groups of p: the bubble shrinks v-fold
    looped_bfs (Lamy-Poirier 2023)  v chunks; GPipe chunk by chunk
    interleaved_zb, zbv (Qi 2024)   zero bubble: Backward split into B (input gradient: the previous
                                    stage waits for it) and W (weight gradients: nobody waits), W
                                    played into the slots where 1F1B waits (``players.py``); zbv
                                    folds two chunks per rank in a V
    dualpipev (DeepSeek-V3)         the V, each forward of one chunk paired with a whole backward of
                                    the other chunk

    for each computation op of a rank's order:       # stage s, micro-batch mb
        Forward:  RecvAct from the rank of s-1 before it, SendAct to the rank of s+1 after it
        Backward: RecvGrad from the rank of s+1 before it, SendGrad to the rank of s-1 after it
    end with OptimizerStep()

The instructions are in ``instructions.py``; ``simulation.py`` checks and times the lists on the
one simulator (``simulate``: no deadlock, every micro-batch once per stage, in-flight activations,
bubble; the cost model prices the same lists through ``mpkit.pricing.pipeline_program``); the labs
draw them; ``executor.PipelineExecutor`` runs them for real.

Stages are numbered globally: with ``p`` ranks and ``v`` virtual stages (model chunks) per rank
there are ``p·v`` stages and stage ``s`` lives on rank ``s % p`` (Megatron's interleaving: rank 0
holds stages 0, p, 2p, ...). Without interleaving (v = 1) stage = rank. ``zbv`` and ``dualpipev``
place their two chunks per rank in a V (``placement``).
"""
from __future__ import annotations

from mpkit.parallel.pipeline.instructions import (COMM, COMPUTE, Backward, BackwardInput, BackwardWeight, Forward,
                                                  OptimizerStep, RecvAct, RecvGrad, SendAct, SendGrad, batches)
from mpkit.parallel.pipeline.players import play_orders, play_zbv
from mpkit.parallel.pipeline.simulation import (ScheduleError, Simulation, computation, dataflow, engine_instructions,
                                                message, simulate, validate)
from mpkit.vocabulary import SCHEDULES  # every schedule below has an entry in ORDERS

MULTI_CHUNK = ("interleaved", "looped_bfs", "interleaved_zb")  # virtual_stages chunks per rank, stage s on rank s % p
V_SHAPED = ("zbv", "dualpipev")  # two chunks per rank in a V: rank r holds stages r and 2p-1-r


# ---- the schedules: each returns every rank's computations in order (p ranks, m micro-batches, v chunks) --------

def gpipe(p, m, v=1) -> list[list]:
    """Fill, then drain: all m forwards, then all m backwards; every rank keeps m activations alive."""
    return [[Forward(i, r) for i in range(m)] + [Backward(i, r) for i in range(m)] for r in range(p)]


def one_f_one_b(p, m, v=1) -> list[list]:
    """1F1B (PipeDream-Flush, Narayanan et al. 2021): rank r runs p-1-r warm-up forwards, then
    alternates one forward and one backward; the same bubble as GPipe, p-r activations alive."""
    return [_warm_up_then_alternate([Forward(k, r) for k in range(m)], [Backward(k, r) for k in range(m)],
                                    min(p - 1 - r, m)) for r in range(p)]


def interleaved(p, m, v) -> list[list]:
    """Megatron's interleaved 1F1B (Narayanan et al. 2021 §2.2): v chunks per rank (stage s on rank
    s % p); micro-batches in groups of p visit chunk 0, 1, ..., v-1 forward and the chunks in
    reverse backward; 2(p-1-r) + (v-1)·p warm-up forwards on rank r."""
    def visit(k, backward, rank):  # the k-th forward (backward) of ``rank``: (micro-batch, stage)
        chunk = (k // p) % v
        return (k // (p * v)) * p + k % p, (v - 1 - chunk if backward else chunk) * p + rank

    total = m * v
    return [_warm_up_then_alternate([Forward(*visit(k, False, r)) for k in range(total)],
                                    [Backward(*visit(k, True, r)) for k in range(total)],
                                    min((p - r - 1) * 2 + (v - 1) * p, total)) for r in range(p)]


def looped_bfs(p, m, v) -> list[list]:
    """Looped BFS (Lamy-Poirier 2023): GPipe chunk by chunk, every micro-batch through a rank's
    first chunk before its next; the interleaved bubble with GPipe's memory."""
    orders = []
    for rank in range(p):
        mine = range(rank, p * v, p)
        orders.append([Forward(i, s) for s in mine for i in range(m)]
                      + [Backward(i, s) for s in reversed(mine) for i in reversed(range(m))])
    return orders


def interleaved_zb(p, m, v) -> list[list]:
    """Zero bubble on (interleaved) 1F1B's order (ZB-H1 with v = 1, Qi et al. 2024): each Backward
    becomes B, and each W fills a slot where 1F1B would wait (``players.play_orders``)."""
    orders = one_f_one_b(p, m) if v == 1 else interleaved(p, m, v)
    return play_orders(orders, p * v - 1, True)[0]


def zbv(p, m, v=2) -> list[list]:
    """ZB-V (Qi et al. 2024): two chunks per rank in a V, played greedily (``players.play_zbv``)."""
    return play_zbv(p, m, placement("zbv", p))


def dualpipev(p, m, v=2) -> list[list]:
    """DualPipeV (DeepSeek-V3's DualPipe folded in a V), as torch 2.13's ``ScheduleDualPipeV``."""
    return [_dualpipev_rank(p, m, rank) for rank in range(p)]


ORDERS = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved, "looped_bfs": looped_bfs,
          "interleaved_zb": interleaved_zb, "zbv": zbv, "dualpipev": dualpipev}


def _warm_up_then_alternate(forwards, backwards, warmup) -> list:
    """1F1B's shape: ``warmup`` forwards, then one forward and one backward in turn, then the backwards left."""
    order = forwards[:warmup]
    for forward, backward in zip(forwards[warmup:], backwards):  # steady state
        order += [forward, backward]
    return order + backwards[len(forwards) - warmup:]  # cool-down


def _dualpipev_rank(p, m, rank):
    """One rank's order under DualPipeV, step for step as torch 2.13's
    ``ScheduleDualPipeV._calculate_single_rank_operations`` builds it. Rank r holds chunk 0 = stage
    r and chunk 1 = stage 2p-1-r. In its main phase it pairs the forward of one chunk with the whole
    backward (B and W at once) of the other chunk, for two different micro-batches (torch's
    OVERLAP_F_B action: here the two in order, as torch's runtime also runs them unless a custom
    function overlaps their compute and communication). W is split off only at the edges: where a B
    would otherwise leave the rank idle (after the warm-up and in the cool-down, the pending W
    filling the waits)."""
    c0, c1 = rank, 2 * p - 1 - rank
    nxt, weights, out = {}, [], []  # (stage, kind) -> next micro-batch; pending W, oldest first

    def take(stage, kind):
        mb = nxt.get((stage, kind), 0)
        nxt[(stage, kind)] = mb + 1
        return mb

    def f(stage):
        out.append(Forward(take(stage, Forward), stage))

    def b(stage, split=False):  # a whole backward, or its B with the W queued
        mb = take(stage, Backward)
        out.append(BackwardInput(mb, stage) if split else Backward(mb, stage))
        if split:
            weights.append(BackwardWeight(mb, stage))

    def w():
        if weights:
            out.append(weights.pop(0))

    for _ in range((p - rank - 1) * 2):  # 1: chunk 0's warm-up forwards
        f(c0)
    for _ in range(rank + 1):  # 2: forwards through both chunks
        f(c0)
        f(c1)
    for _ in range(p - rank - 1):  # 3: B, W, F of chunk 1 (zero bubble)
        b(c1, True)
        w()
        f(c1)
    for _ in range(m - 2 * p + rank + 1):  # 4: the main phase, F0 with B1 then F1 with B0 (each an overlapped pair)
        f(c0)  # torch: a plain F then B on the last rank's first round, an OVERLAP_F_B pair elsewhere
        b(c1)
        f(c1)
        b(c0)
    for _ in range(p - rank - 1):  # 5: B of chunk 1, then F1 with B0
        b(c1)
        f(c1)
        b(c0)
    split = False
    for i in range(rank + 1):  # 6: backwards of both chunks, split into B and W from the middle on
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        b(c1, split)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        b(c0, split)
    for _ in range(p - rank - 1):  # 7: a pending W, then B of chunk 0
        w()
        b(c0, split)
    for _ in range(rank + 1):  # 8: the W left
        w()
    return out


# ---- where the stages live, and which arguments a schedule takes -------------------------------------------------

def chunks_per_rank(name, virtual=1) -> int:
    """Model chunks (stages) each rank holds under schedule ``name``."""
    return virtual if name in MULTI_CHUNK else 2 if name in V_SHAPED else 1


def placement(name, ranks, virtual=1) -> list[int]:
    """The rank of each stage: round robin (stage s on rank s % p), or a V for ``zbv`` and
    ``dualpipev`` (rank r holds stages r and 2p-1-r, so the first and the last stage share rank 0
    and the middle two share rank p-1, where an activation passes without a message)."""
    count = ranks * chunks_per_rank(name, virtual)
    if name in V_SHAPED:
        return [s if s < ranks else count - 1 - s for s in range(count)]
    return [s % ranks for s in range(count)]


def check_schedule_args(name, stages, micro_batches, virtual=1) -> None:
    if name not in SCHEDULES:
        raise ValueError(f"schedule={name!r} is unknown; use one of {', '.join(map(repr, SCHEDULES))}")
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches!r}: pass a whole number >= 1")
    if name in V_SHAPED and stages < 2:
        raise ValueError(f"schedule={name!r} needs world_size >= 2 (its V folds the stages back over the ranks)")
    if name == "dualpipev" and micro_batches < 2 * stages:
        raise ValueError(f"schedule='dualpipev' needs micro_batches >= 2*(pipeline ranks)={2 * stages} (at least one "
                         f"micro-batch per stage, as torch's ScheduleDualPipeV); got micro_batches={micro_batches}")
    if name not in MULTI_CHUNK:
        return
    least = 1 if name == "interleaved_zb" else 2
    if not isinstance(virtual, int) or virtual < least:
        raise ValueError(f"virtual_stages={virtual!r}: schedule={name!r} needs virtual_stages >= {least} "
                         f"model chunks per rank" + (" (with 1 it is plain '1f1b')" if name == "interleaved" else ""))
    if stages < 2 and virtual > 1:
        raise ValueError(f"schedule={name!r} needs world_size >= 2 (on one rank the chunks would pass "
                         f"activations to themselves); use schedule='gpipe' or '1f1b'")
    if name != "looped_bfs" and virtual > 1 and micro_batches % stages:
        raise ValueError(f"schedule={name!r} needs micro_batches to be a multiple of world_size={stages} "
                         f"(micro-batches go round the ranks in groups of {stages}); got micro_batches={micro_batches}")


# ---- the lists: each rank's order with its messages ---------------------------------------------------------------

def compute_orders(name, ranks, micro_batches, virtual=1) -> list[list]:
    """Every rank's computations in order, without the messages (see ``schedule``)."""
    check_schedule_args(name, ranks, micro_batches, virtual)
    return ORDERS[name](ranks, micro_batches, chunks_per_rank(name, virtual))


def schedule(name: str, stages: int, micro_batches: int, virtual: int = 1) -> list[list]:
    """Instruction lists, one per rank, for ``stages`` ranks and ``micro_batches`` micro-batches.

    A send goes right after the computation that produced it. A receive goes right before the
    computation that needs it — for ``gpipe``, ``1f1b`` and ``interleaved``; the newer schedules
    post it as soon as the sender has sent (on unit costs), since a rank can run a long way ahead
    of its neighbour (looped BFS's whole first chunk) and gloo's sends complete only once received.
    The sends of one computation and the receives of the next form a batch. Two consecutive
    stages on one rank (the turn of ``zbv``'s V) pass their tensors without a message.
    """
    orders = compute_orders(name, stages, micro_batches, virtual)
    where = placement(name, stages, virtual)
    last = len(where) - 1
    early = name not in ("gpipe", "1f1b", "interleaved")
    start = play_orders(orders, last, False)[1] if early else {}
    finish = {(op.mb, op.stage) if not isinstance(op, Forward) else op: t + 1 for op, t in start.items()
              if not isinstance(op, BackwardWeight)}
    programs = []
    for rank, order in enumerate(orders):
        posted = []  # receives this rank posts ahead of their computation, by the sender's time
        if early:
            posted = sorted((finish[_producer(recv)], i, recv) for i, op in enumerate(order)
                            for recv in [_messages(op, rank, where, last)[0]] if recv is not None)
        program, k = [], 0
        for op in order:
            recv, send = _messages(op, rank, where, last)
            if early:
                while k < len(posted) and (posted[k][0] <= start[op] or posted[k][2] == recv):
                    program.append(posted[k][2])
                    k += 1
            elif recv is not None:
                program.append(recv)
            program += [op] + ([send] if send is not None else [])
        programs.append(program + [OptimizerStep()])
    return programs


def _messages(op, rank, where, last):
    """(receive, send) around computation ``op`` on ``rank``: None where the neighbour stage is
    on the same rank (or there is none)."""
    s = op.stage
    if isinstance(op, Forward):
        recv = RecvAct(op.mb, s, where[s - 1]) if s > 0 and where[s - 1] != rank else None
        return recv, (SendAct(op.mb, s, where[s + 1]) if s < last and where[s + 1] != rank else None)
    if isinstance(op, BackwardWeight):
        return None, None
    recv = RecvGrad(op.mb, s, where[s + 1]) if s < last and where[s + 1] != rank else None
    return recv, (SendGrad(op.mb, s, where[s - 1]) if s > 0 and where[s - 1] != rank else None)


def _producer(recv):
    """The computation (on the sending rank) whose result ``recv`` receives."""
    if isinstance(recv, RecvAct):
        return Forward(recv.mb, recv.stage - 1)
    return recv.mb, recv.stage + 1


__all__ = [  # the schedules and the names labs, exercises and the cost model import from here
    "SCHEDULES", "MULTI_CHUNK", "V_SHAPED", "ORDERS", "gpipe", "one_f_one_b", "interleaved",
    "looped_bfs", "interleaved_zb", "zbv", "dualpipev", "chunks_per_rank", "placement", "check_schedule_args",
    "compute_orders", "schedule",
    # re-exported: the instructions (instructions.py) and the simulator glue (simulation.py)
    "Forward", "Backward", "BackwardInput", "BackwardWeight", "SendAct", "RecvAct", "SendGrad", "RecvGrad",
    "OptimizerStep", "COMPUTE", "COMM", "batches", "ScheduleError", "Simulation", "simulate", "validate", "message",
    "dataflow", "computation", "engine_instructions"]
