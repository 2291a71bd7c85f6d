"""Hybrid sharding (HSDP, issue 31): ZeRO within groups of ``shard`` neighbouring DP ranks, replicas
across them. It holds shard-sized rather than dp-sized state shares, keeps the per-micro-batch
gathers and reduce-scatters inside a node and pays one all-reduce of the shards across nodes."""
import pytest

from mpkit.sim import formulas, plan

MODEL = dict(layers=32, hidden=4096, heads=32, seq_len=512)  # short sequences: FSDP traffic shows
KW = dict(model=MODEL, hardware="Nx8xA100-opa", gpus=256, global_batch=1024, tp=1, pp=1, zero=3, recompute="none",
          micro_batch=1)


def test_hsdp_trades_memory_for_traffic_inside_a_node():
    full, hybrid = plan(**KW).best, plan(**KW, shard=8).best
    psi = full.comm_bytes["dp"] / 2  # parameters on the rank (bf16 gradient bytes / 2)
    assert hybrid.memory["optimizer"] == pytest.approx(formulas.zero_memory(psi, 8, 3)["optimizer"])
    assert full.memory["optimizer"] == pytest.approx(formulas.zero_memory(psi, 256, 3)["optimizer"])
    assert hybrid.time["dp"] < full.time["dp"] / 3  # 4 micro-batches of gathers on NVLink, not Omni-Path
    assert "HSDP: ZeRO within groups of 8" in plan(**KW, shard=8).explain()


def test_hsdp_needs_a_zero_stage_and_a_shard_that_divides_dp():
    with pytest.raises(ValueError, match="shard=8 shards ZeRO's states over groups of the DP dimension: pin zero=1"):
        plan(**{**KW, "zero": 0}, shard=8)
    with pytest.raises(ValueError, match="shard=3 does not divide dp=256"):
        plan(**KW, dp=256, shard=3)
    searched = plan(**{k: v for k, v in KW.items() if k != "zero"}, shard=8)
    assert {e.setup.zero for e in searched.rows + searched.dropped} == {1, 2, 3}


def test_fsdp_keeping_weights_after_forward_gathers_once_and_holds_the_stage():
    """FSDP2's reshard_after_forward=False: backward reuses forward's gathered weights (one all-gather
    per micro-batch instead of two) and holds the whole stage's bf16 weights until its backward."""
    kept, default = plan(**KW, reshard_after_forward=False).best, plan(**KW).best
    assert kept.time["dp"] < default.time["dp"]
    psi = default.comm_bytes["dp"] / 2
    assert kept.memory["parameters"] - default.memory["parameters"] == pytest.approx(
        (psi - 2 * default.model.layer_parameters) * 2)
    table = plan(**KW, reshard_after_forward=False)
    assert "weights kept after forward" in table.explain() and "reshard_after_forward=False" in str(table)
    with pytest.raises(ValueError, match="reshard_after_forward='no' must be True or False"):
        plan(**KW, reshard_after_forward="no")
