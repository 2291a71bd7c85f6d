"""The training software as an explicit, visible input of the planner (issue 31): ``stack=`` prices
matmuls at the rate that software's published runs imply on the GPU, says so in the table, and
refuses a stack that never ran on the GPU; the constants are what benchmarks/published.py fits."""
import pytest
from published_script import load_published

from mpkit.sim import plan, planner
from mpkit.simulator.hardware import STACKS, gpu_model, with_stack
from mpkit.simulator.machines import get_hardware

LAB = dict(model="gpt3-175b", hardware="128x8xA100-ib", gpus=1024, global_batch=1536, zero=1, top=3)


def test_a_stack_sets_the_matmul_rate_and_the_table_says_which():
    generic, megatron, deepspeed = (plan(**LAB, stack=s) for s in (None, "megatron", "deepspeed"))
    assert megatron.hardware.mfu == 0.66 and deepspeed.hardware.mfu == 0.54
    assert megatron.best.step_time < generic.best.step_time < deepspeed.best.step_time
    assert "Software: Megatron-LM, matmuls at 66% of peak (fitted to Narayanan et al. 2021" in str(megatron)
    assert "Software: not given, matmuls at 65% of peak, the hardware preset's sustained matmul rate" in str(generic)
    assert "소프트웨어: Megatron-DeepSpeed" in deepspeed.to_text("ko")


def test_a_stack_without_runs_on_the_gpu_is_refused_with_the_ones_that_have():
    with pytest.raises(ValueError, match="stack='deepspeed' has no published runs on 'H100'; stacks measured on "
                                         "it: 'generic', 'megatron', 'torchtitan', 'llm-foundry', 'llama3', 'nemo'"):
        plan("gpt3-175b", "16x8xH100-ib", gpus=128, global_batch=512, stack="deepspeed")
    with pytest.raises(ValueError, match="stack='nemo' has no published runs on 'A100'"):
        plan("gpt3-175b", "16x8xA100-ib", gpus=128, global_batch=512, stack="nemo")
    with pytest.raises(ValueError, match="stack='megatron-lm' is unknown; use one of 'generic', 'megatron'"):
        plan("gpt3-175b", "16x8xH100-ib", gpus=128, global_batch=512, stack="megatron-lm")
    assert gpu_model(get_hardware("Nx8xA100-40GB-ib")) == "A100-40GB"
    assert with_stack(get_hardware("Nx8xA100-40GB-ib"), "megatron").mfu == 0.66  # an A100's rate


def test_the_stacks_users_pick_price_h100_from_their_own_sources():
    """Megatron-LM on H100 was refused (issue 46): its rate comes from the Megatron-LM README's H100
    runs, NeMo's from NeMo's DGX-H100 table; neither source is among the validation runs, and the
    table says which source it used."""
    megatron = plan("gpt3-175b", "16x8xH100-ib", gpus=128, global_batch=512, stack="megatron")
    assert megatron.hardware.mfu == STACKS["megatron"].matmul["H100"]
    assert "Megatron-LM README's GPT-3 175B on 96 and 4,608 GPUs" in str(megatron)
    nemo = plan("gpt3-175b", "16x8xH100-ib", gpus=128, global_batch=512, stack="nemo", fp8=True)
    assert nemo.hardware.mfu == STACKS["nemo"].matmul["H100"] and "all FP8" in str(nemo)
    published = load_published()
    validation = {run.source for run in published.RUNS}
    assert {run.source for run in published.STACK_RUNS}.isdisjoint(validation)
    assert {published.STACK_OF[run.source] for run in published.STACK_RUNS} == {"megatron", "nemo"}


def test_the_widget_has_a_software_control():
    state = planner(model="gpt3-175b", hardware="Nx8xA100-ib", gpus=1024, global_batch=1536, stack="torchtitan",
                    lang="en").planner
    assert state.result.hardware.mfu == STACKS["torchtitan"].matmul["A100"]
    state.controls["stack"].value = None
    assert state.result.hardware.mfu == STACKS["generic"].matmul["A100"]


@pytest.mark.timeout(120)
def test_the_constants_are_what_the_published_runs_fit(monkeypatch):
    published = load_published()
    printed = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(" ".join(map(str, a))))
    published.print_stacks()
    rows = [line.split(" | ") for text in printed for line in text.splitlines() if line.startswith("| ")]
    fitted = {(r[0].strip("| "), r[1]): float(r[3]) for r in rows if r[1] in ("A100", "H100")}
    assert fitted == {(stack, gpu): eff for stack, s in STACKS.items() if stack != "generic"
                      for gpu, eff in s.matmul.items()}
