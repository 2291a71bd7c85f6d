"""One truth per strategy: the cost model's program (``Strategy.program``, beside ``run_rank``)
and a real run produce the same kinds of events in the same order on every rank.

Granularity differs on purpose: a run times a whole forward/backward as one span, a program
prices layer by layer, so consecutive compute events of one kind count once. Messages are
compared per channel (kind and stage, in order of micro-batch), which is the order gloo matches
them in; collectives in the order each rank issues them, with their names.
"""
import math

import pytest

import mpkit
from mpkit.sim import Hardware, Link, predict

# Every op costs a little, every message a little: orders come from the programs, not from ties.
MACHINE = Hardware(name="test", flops=1e9, mfu=1.0, mem_bw=math.inf,
                   op_overhead={"forward": 1e-6, "backward": 1e-6, "optimizer": 1e-6},
                   p2p=Link(1e-6, 1e-12), collective=Link(1e-6, 1e-12))
CASES = [("single", 1, {}), ("dp", 2, {}), ("dp", 2, {"overlap": True, "bucket_mb": 0}),
         ("dp", 2, {"find_unused_parameters": True}), ("ddp", 2, {}),
         ("zero1", 2, {}), ("fsdp", 2, {}), ("mp", 2, {}), ("tp", 2, {}), ("pp", 2, {"schedule": "1f1b"}),
         ("pp", 2, {"schedule": "interleaved"}), ("ps", 3, {"mode": "sync"}),
         ("3d", 8, {"dp": 2, "tp": 2, "pp": 2, "model": "gpt"}), ("3d", 4, {"dp": 2, "pp": 2, "zero": True}),
         ("3d", 4, {"dp": 2, "pp": 2, "order": "megatron"}),  # the program reads the run's order: PP outermost
         ("sp", 2, {"model": "gpt"}), ("cp", 2, {"model": "gpt"}), ("cp", 4, {"model": "gpt", "attention": "ulysses"}),
         ("ep", 2, {"model": "gpt", "experts": 4, "top_k": 2})]


def signature(events, rank, step):
    events = sorted((e for e in events if e.rank == rank and e.step == step), key=lambda e: (e.start, e.end))
    compute = []
    for e in events:
        if e.category == "compute" and (not compute or compute[-1] != e.kind):
            compute.append(e.kind)
    collectives = [(e.kind, e.name) for e in events if e.kind in ("all_reduce", "all_gather", "reduce_scatter")]
    channels = {}
    for e in events:
        if e.kind in ("send", "recv", "rpc"):
            channels.setdefault((e.kind, e.stage), []).append(e.micro_batch)
    return compute, collectives, channels


def test_every_strategy_is_covered():
    from mpkit.strategies import REGISTRY

    assert {name for name, _, _ in CASES} == set(REGISTRY)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy,world_size,options", CASES, ids=lambda v: str(v))
def test_predicted_and_measured_events_agree(strategy, world_size, options):
    batch = 24 if strategy == "ps" else 32
    run = mpkit.train(strategy, world_size, steps=2, batch_size=batch, **options)
    prediction = predict(strategy, hardware=MACHINE, world_size=world_size, batch_size=batch, **options)
    for rank in range(world_size):
        # step 1 of the run: steady state (DDP rebuilds its buckets and ps workers pull from step 1 on)
        measured, predicted = signature(run.trace.events, rank, 1), signature(prediction.trace.events, rank, 0)
        assert measured[0] == predicted[0], f"rank {rank}: compute phases"
        assert measured[1] == predicted[1], f"rank {rank}: collectives"
        assert measured[2] == predicted[2], f"rank {rank}: messages per channel"
        assert measured[0], "a step with no compute"


@pytest.mark.timeout(120)
def test_3d_stage_that_starts_at_a_row_parallel_layer():
    """A pipeline stage of the mlp whose first layer is row-parallel receives the column-parallel
    layer's slice (hidden/tp features): the cost model prices that message, as the run sends it
    (it used to profile the stage on the full width and crash in the matmul)."""
    options = {"dp": 1, "tp": 2, "pp": 2, "layers": 3}  # stages: layer 0 (column) | layers 1 (row), 2
    run = mpkit.train("3d", 4, steps=2, **options)
    prediction = predict("3d", hardware=MACHINE, world_size=4, **options)

    def sends(events, step):
        return sorted((e.rank, e.micro_batch, e.bytes) for e in events if e.kind == "send" and e.step == step)

    assert sends(prediction.trace.events, 0) == sends(run.trace.events, 1)
    assert {b for _, _, b in sends(run.trace.events, 1)} == {32 // 2 * 64 // 2 * 4}  # micro-batch x hidden/tp, fp32
