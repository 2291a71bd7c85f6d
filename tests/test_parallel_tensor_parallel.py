"""``mpkit.parallel.tensor_parallel`` on a learner's model: parity with one device on 2 and 4 ranks,
index lists of any length and order, unpaired plans, frozen and tied layers, and bad input.
Models and tolerance: ``parallel_models``."""
import torch
import torch.nn.functional as F
from torch import nn

import pytest

import mpkit
from parallel_models import assert_every_rank_raises, ATOL, deep_data, deep_net, make_net, raised, single_deep, state, train_deep


def _tp_rank(ctx):
    from mpkit.parallel import full_parameters, tensor_parallel

    model = tensor_parallel(deep_net(), {"*.mlp.up": "column", "*.mlp.down": "row"})
    losses = train_deep(model)  # every rank sees the whole batch; only the split layers differ
    kinds = sorted({(e.kind, e.name.split(" ")[0]) for e in ctx.trace.events})
    return losses, full_parameters(model), sum(p.numel() for p in model.parameters()), kinds


def _uneven_tp_rank(ctx, lists):
    from mpkit.parallel import Split, full_parameters, tensor_parallel

    model = tensor_parallel(deep_net(), {"*.mlp.up": Split("column", lists), "*.mlp.down": Split("row", lists)})
    return train_deep(model), full_parameters(model)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lists", [[list(range(40)), list(range(40, 64))],  # 40 and 24 of the 64 features
                                   [list(range(64)), []]])  # a rank with none of them
def test_tensor_parallel_with_index_lists_of_different_lengths_matches_single(lists):
    # full_parameters all-gathers padded slices (gloo aborted on unequal sizes); the same 1e-5
    # tolerance as the even split: only the row layer's partial sums change order
    ref_losses, ref_state = single_deep()
    for losses, params in mpkit.launch(_uneven_tp_rank, 2, args=(lists,), timeout=100):
        assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= ATOL
        assert set(params) == set(ref_state)
        assert all((params[k] - ref_state[k]).abs().max().item() <= ATOL for k in ref_state)


def test_head_split_refuses_heads_the_ranks_do_not_divide():
    from mpkit.parallel import head_split

    with pytest.raises(ValueError, match=r"head_split\(10, 4\): 4 ranks do not divide hidden=10"):
        head_split(10, 4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 4])
def test_tensor_parallel_on_a_user_model(world_size):
    # every rank sees the whole batch; a row-parallel layer sums partial products in another
    # order than one matmul: float32 noise of ~1e-7, so the same 1e-5 tolerance holds
    ref_losses, ref_state = single_deep()
    full = sum(p.numel() for p in deep_net().parameters())
    for losses, params, local, kinds in mpkit.launch(_tp_rank, world_size, timeout=100):
        assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= ATOL
        assert all((params[k] - ref_state[k]).abs().max().item() <= ATOL for k in ref_state)
        split = 3 * (2 * 16 * 64)  # three blocks' up and down weights are cut in world_size pieces
        assert local == full - split + split // world_size - 3 * 64 + 3 * 64 // world_size
        assert ("all_reduce", "g") in kinds and ("all_reduce", "f") in kinds  # traced inside mpkit.launch


def test_tensor_parallel_keeps_a_frozen_layer_frozen():
    # the slices are new Parameters; a frozen layer that came back trainable would silently train
    from mpkit.parallel import tensor_parallel

    block = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    block[0].requires_grad_(False)
    tensor_parallel(block, {"0": "column", "2": "row"}, rank=0, world_size=2)
    assert [(n, p.requires_grad) for n, p in block.named_parameters()] == [
        ("0.weight", False), ("0.bias", False), ("2.weight", True), ("2.bias", True)]


def test_tensor_parallel_refuses_to_untie_a_tied_layer():
    # splitting the head would leave the embedding with the full tensor and the head with a new
    # slice: two tensors trained apart where one device trains one
    from mpkit.parallel import tensor_parallel

    with pytest.raises(ValueError, match="layer 'head' shares a parameter with 'emb.weight' .* Leave 'head' out"):
        tensor_parallel(make_net(), {"head": "column"}, rank=0, world_size=2)


def test_tensor_parallel_takes_an_unpaired_plan_whose_column_layers_say_what_their_output_is():
    # the pairing rule belongs to mpkit.train("tp") (one plan, one call); the public mechanism takes
    # each layer on its own: a lone column layer that gathers its output, a plan in two calls
    from mpkit.parallel import ColumnParallelLinear, RowParallelLinear, Split, tensor_parallel

    head = tensor_parallel(output_net(), {"2": Split("column", gather_output=True)}, rank=0, world_size=2)
    assert isinstance(head[2], ColumnParallelLinear) and head[2].gather_output
    for first, second in [({"*.mlp.up": Split("column", gather_output=False)}, {"*.mlp.down": "row"}),
                          ({"*.mlp.down": "row"}, {"*.mlp.up": "column"})]:  # either order, in two calls
        model = tensor_parallel(tensor_parallel(deep_net(), first, rank=0, world_size=2), second, rank=0, world_size=2)
        assert isinstance(model[1].mlp.up, ColumnParallelLinear) and not model[1].mlp.up.gather_output
        assert isinstance(model[1].mlp.down, RowParallelLinear)
    # a plain column layer with no row layer anywhere: slice or full output is not guessed, and the
    # refusal comes before any layer is swapped
    model = deep_net()
    before = [type(m) for m in model.modules()]
    with pytest.raises(ValueError, match=r"plan splits 0 by columns but no layer by rows.*"
                                         r"Split\('column', gather_output=True\)"):
        tensor_parallel(model, {"0": "column"}, rank=0, world_size=2)
    assert [type(m) for m in model.modules()] == before  # still whole: usable on one device
    with pytest.raises(ValueError, match="gather_output applies to 'column' layers"):
        tensor_parallel(model, {"0": Split("row", gather_output=True)}, rank=0, world_size=2)


@pytest.mark.parametrize("indices, fault", [
    ([[0, 1, 2, 3, 4], [4, 5, 6, 7, 8]], r"more than once: \[4\]; on no rank: \[9\]"),  # overlap
    ([[0, 0, 1, 2, 3, 4], [5, 6, 7, 8, 9]], r"more than once: \[0\]"),  # twice on one rank
    ([[0, 1, 2, 3], [5, 6, 7, 8, 9]], r"on no rank: \[4\]"),  # a gap
    ([[0, 1, 2, 3, 4], [5, 6, 7, 8, 10]], r"outside 0..9: \[10\]; on no rank: \[9\]"),
])
@pytest.mark.parametrize("gather_output", [True, False])
def test_split_index_lists_must_hold_each_feature_exactly_once(indices, fault, gather_output):
    # an index on two ranks would count twice, a missing one would stay uninitialised in the
    # gathered output (or be dropped from the slices): refused before any layer is swapped
    from mpkit.parallel import Split, tensor_parallel

    model = output_net()
    before = [type(m) for m in model.modules()]
    with pytest.raises(ValueError, match=r"layer 2: its index lists must hold each of its out_features=10 exactly "
                                         r"once across the ranks; indices " + fault):
        tensor_parallel(model, {"2": Split("column", indices, gather_output=gather_output)}, rank=0, world_size=2)
    assert [type(m) for m in model.modules()] == before
    with pytest.raises(ValueError, match="3 index lists for a tp size of 2; give one per rank"):
        tensor_parallel(model, {"2": Split("column", [[0], [1], [2]], gather_output=True)}, rank=0, world_size=2)
    with pytest.raises(ValueError, match="1-D list or tensor of whole numbers"):
        tensor_parallel(model, {"2": Split("column", [[0.0] * 5, [1.0] * 5], gather_output=True)}, rank=0,
                        world_size=2)


def test_split_index_lists_that_partition_the_features_in_any_order_train_like_single():
    # strided lists (rank 0 the even classes, rank 1 the odd) gathered back into the full output
    from mpkit.parallel import Split

    strided = Split("column", [list(range(0, 10, 2)), list(range(1, 10, 2))], gather_output=True)
    run = mpkit.train("tp", 2, model=output_net, data=deep_data, loss=F.cross_entropy, steps=3, batch_size=8,
                      optimizer="adam", plan={"2": strided})
    assert run.compare_to_reference().max <= ATOL  # tolerance as for contiguous slices: the f all-reduce's order


def output_net():
    """A small classifier whose output layer is split over its classes (vocab-parallel)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 10))


def _unpaired_tp_rank(ctx):
    from mpkit.parallel import Split, full_parameters, tensor_parallel

    out = []
    head = tensor_parallel(output_net(), {"2": Split("column", gather_output=True)})  # a lone column layer
    two_calls = tensor_parallel(deep_net(), {"*.mlp.up": Split("column", gather_output=False)})
    two_calls = tensor_parallel(two_calls, {"*.mlp.down": "row"})  # the plan in two calls
    for model in (head, two_calls):
        out.append((train_deep(model), full_parameters(model)))
    return out, [e.name for e in ctx.trace.events if e.kind == "all_gather"]


@pytest.mark.timeout(120)
def test_tensor_parallel_on_an_unpaired_plan_matches_single_device():
    # every rank sees the whole batch. The gathered output is the full layer's output exactly
    # (a concatenation); the f all-reduce sums the input gradient's two partial products in
    # another order than one matmul, and the row layer its partial outputs: float32 noise of
    # ~1e-7 after 3 AdamW steps, so the 1e-5 tolerance of the other parity tests holds
    refs = []
    for make in (output_net, deep_net):
        model = make()
        refs.append((train_deep(model), state(model)))
    for models, gathers in mpkit.launch(_unpaired_tp_rank, 2, timeout=100):
        for (losses, params), (ref_losses, ref_state) in zip(models, refs):
            assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= ATOL
            assert set(params) == set(ref_state)
            assert all((params[k] - ref_state[k]).abs().max().item() <= ATOL for k in ref_state)
        # the lone column layer's output went through one all-gather per forward (3 steps); the
        # others are full_parameters' gathers of the split weights afterwards
        assert [g for g in gathers if g.startswith("gather forward")] == ["gather forward 2"] * 3


@pytest.mark.timeout(120)
def test_train_tp_takes_a_lone_column_layer_that_gathers_its_output():
    # mpkit.train("tp") wants its split layers in pairs, but a gathered column layer gives the
    # full output and stands alone. Tolerance as above: the f all-reduce's summation order only.
    from mpkit.parallel import Split

    run = mpkit.train("tp", 2, model=output_net, data=deep_data, loss=F.cross_entropy, steps=3, batch_size=8,
                      optimizer="adam", plan={"2": Split("column", gather_output=True)})
    assert run.compare_to_reference().max <= ATOL
    assert run.extra[0]["sharded_layers"] == ["2"]


def _bad_input_rank(ctx, case):
    from mpkit.parallel import tensor_parallel

    cases = {
        "missing layer": lambda: tensor_parallel(deep_net(), {"mlp.upp": "column"}),
        "not linear": lambda: tensor_parallel(deep_net(), {"3": "column"}),
        "not divisible": lambda: tensor_parallel(nn.Sequential(nn.Linear(4, 3)), {"0": "column"}),
        "bad style": lambda: tensor_parallel(deep_net(), {"0": "diagonal"}),
    }
    return raised(cases[case])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case,message", [
    ("missing layer", "plan names 'mlp.upp', but the module has no such layer; its nn.Linear layers: 0, "),
    ("not linear", "ColumnParallelLinear slices an nn.Linear; 3 is a Tanh"),
    ("not divisible", "layer 0: tp size 2 does not divide out_features=3"),
    ("bad style", "use 'column', 'row'"),
])
def test_bad_input_is_a_clear_error(case, message):
    assert_every_rank_raises(_bad_input_rank, case, message)
