"""``sim.predict`` on the sequence strategies: it prices sp, cp and ep on a GPU preset, their
predicted activations shrink as the mechanisms promise, and 3d with cp or sp, which it does not
price, says so. (The order of their events against real runs: tests/test_program_matches_run.py.)"""
import pytest

from mpkit.sim import predict

GPT = dict(hardware="8xH100-nvlink", world_size=4, model="gpt", seq_len=64, batch_size=16)


def activations(prediction):
    return [m["activations"] for m in prediction.memory]


def test_sp_and_cp_predict_smaller_activations_than_tp_and_dp():
    tp, sp = predict("tp", **GPT), predict("sp", **GPT)
    dp, cp = predict("dp", **GPT), predict("cp", **GPT)
    single = predict("single", **{**GPT, "world_size": 1})
    assert max(activations(sp)) < min(activations(tp))  # SP splits the LayerNorm/residual share too
    assert max(activations(sp)) == pytest.approx(activations(single)[0] / 4, rel=0.05)
    assert activations(cp) == activations(dp)  # 1/cp of the tokens, as dp's 1/dp of the sequences
    for p in (sp, cp, predict("cp", attention="ulysses", **GPT), predict("ep", experts=8, **GPT)):
        assert p.played_time > 0


def test_ep_holds_its_share_of_the_experts():
    one, four = predict("ep", experts=8, **{**GPT, "world_size": 2}), predict("ep", experts=8, **GPT)
    assert four.memory[0]["parameters"] < one.memory[0]["parameters"]


def test_3d_with_cp_or_sp_is_not_priced():
    with pytest.raises(ValueError, match="prices 3d without cp and sp"):
        predict("3d", hardware="8xH100-nvlink", world_size=8, model="gpt", dp=2, cp=2, tp=2)
