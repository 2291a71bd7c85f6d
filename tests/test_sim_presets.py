"""Presets beyond one NIC per GPU and 80 GB (issue 31): Jean Zay's four Omni-Path links per 8-GPU node
(BLOOM) and Meta's 96 GB, power-capped H100s (torchtitan's benchmarks), by name like the others."""
import pytest
from published_script import load_published

from mpkit.sim import get_hardware, plan
from mpkit.costmodel.analytic import MODELS
from mpkit.simulator.hardware import FP8_MATMUL_SPEEDUP, MULTI_NODE, gpu_model


def test_omni_path_gives_each_gpu_an_eighth_of_four_links():
    opa, ib = get_hardware("48x8xA100-opa"), get_hardware("48x8xA100-ib")
    assert opa.inter_node.kind == "omni-path" and opa.nodes == 48 and gpu_model(opa) == "A100"
    assert opa.inter_node.bandwidth == pytest.approx(4 * 100e9 / 8 / 8 * 0.8)  # 80 % of 6.25 GB/s per GPU
    assert ib.inter_node.bandwidth / opa.inter_node.bandwidth == pytest.approx(4)  # HDR: 25 GB/s per GPU
    assert "Nx8xA100-opa" in MULTI_NODE


def test_bloom_layout_pays_for_the_slower_network():
    kw = dict(model=dict(layers=70, hidden=14336, heads=112, vocab=250880, dropout=False, learned_positions=False),
              gpus=384, global_batch=2048, tp=4, pp=12, dp=8, micro_batch=2, zero=1, recompute="full",
              order="pp-dp-cp-tp", sequence_parallel=False, flash=False, overlap_dp=False)
    opa, ib = plan(hardware="Nx8xA100-opa", **kw).best, plan(hardware="Nx8xA100-ib", **kw).best
    assert opa.links["pp"] == ib.links["pp"] == "inter" and opa.time["dp"] > ib.time["dp"]
    assert opa.step_time > ib.step_time


def test_the_96gb_h100_has_more_memory_less_bandwidth_and_a_power_capped_peak():
    h96, h80 = get_hardware("8xH100-96GB-nvlink"), get_hardware("8xH100-nvlink")
    assert (h96.memory_bytes, h96.mem_bw) == (96e9, 2.4e12)
    assert h96.flops == (h80.flops + 835e12) / 2  # 500 W: "between SXM and NVL" (torchtitan), the midpoint
    assert gpu_model(get_hardware("Nx8xH100-96GB-ib")) == "H100-96GB"


def test_fp8_speeds_up_the_blocks_matmuls_as_torchtitans_float8_rows_measured():
    kw = dict(model=MODELS["llama3-8b"], hardware="8xH100-96GB-nvlink", gpus=8, global_batch=16, zero=3, tp=1, pp=1,
              micro_batch=2, recompute="op", sequence_parallel=False)
    bf16, fp8 = plan(**kw).best, plan(**kw, fp8=True).best
    assert bf16.step_time / fp8.step_time == pytest.approx(8532 / 6667, rel=0.01)  # torchtitan Table 1, compiled
    assert fp8.memory == bf16.memory and ", FP8" in fp8.setup.describe(fp8.micro_batches) and "fp8=True" in str(
        plan(**kw, fp8=True))
    with pytest.raises(ValueError, match="fp8=True needs FP8 tensor cores .* hardware='8xA100-nvlink' has none"):
        plan("7B", "8xA100-nvlink", gpus=8, global_batch=8, fp8=True)
    published = load_published()
    assert published.fit_fp8() == FP8_MATMUL_SPEEDUP["H100"]
