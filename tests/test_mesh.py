"""``mpkit.parallel.build_mesh``: one ``DeviceMesh`` of a ``Layout`` and its process groups by name.

Checked in one launched world per size, several layouts each (every ``build_mesh`` creates its own
groups): each named group holds exactly the ranks ``Layout.groups`` lists, in both published
orders and an unusual one; a sum over it adds exactly those ranks' values; its ``group_desc``
names it for the trace; a 1-D sub-mesh over it is what ``fully_shard`` takes.
"""
import pytest
import torch
import torch.distributed as dist

import mpkit
from mpkit.layout import GROUPS
from mpkit.observe.comm import group_label
from mpkit.parallel import Layout, build_mesh

LAYOUTS_8 = [Layout(dp=2, pp=2, tp=2), Layout(dp=2, pp=2, tp=2, order="megatron"), Layout(dp=4, tp=2, ep=2),
             Layout(dp=2, cp=2, tp=2, order="tp-cp-dp-pp", ep=2), Layout(cp=8), Layout(dp=8, ep=8)]


def check_meshes(ctx, layouts):
    out = []
    for layout in layouts:
        mesh = build_mesh(layout, ctx.device.type)
        seen = {}
        for name in GROUPS:
            group = mesh.group(name)
            ranks = dist.get_process_group_ranks(group)
            value = torch.tensor([float(ctx.rank)])
            dist.all_reduce(value, group=group)
            seen[name] = (ranks, value.item(), group_label(group))
        sub = mesh.submesh("dp_cp")
        out.append((mesh.coords, seen, sub.mesh.tolist(), sub.mesh_dim_names))
    return out


@pytest.mark.timeout(120)
def test_every_named_group_holds_the_layouts_ranks_and_says_its_name():
    results = mpkit.launch(check_meshes, world_size=8, args=(LAYOUTS_8,), timeout=100)
    for rank, per_layout in enumerate(results):
        for layout, (coords, seen, sub, sub_names) in zip(LAYOUTS_8, per_layout):
            assert coords == layout.coords(rank) and list(coords) == list(layout.dims)
            for name, (ranks, total, label) in seen.items():
                want = layout.group_of(rank, name)
                assert ranks == want, (layout, name)
                assert total == sum(want), (layout, name)  # the collective adds exactly these ranks
                if len(want) > 1:  # a group of one rank is any such group; the others carry a name
                    assert label in ({name, "dp", "cp"} if name in ("dp_cp", "edp") else {name}), (layout, name, label)
            assert sub == layout.group_of(rank, "dp_cp") and sub_names == ("dp_cp",)
    megatron = LAYOUTS_8[1]
    assert megatron.group_of(0, "dp") == [0, 2] and megatron.group_of(0, "pp") == [0, 4]  # PP outermost


@pytest.mark.timeout(60)
def test_a_layout_for_another_world_is_refused_by_name():
    with pytest.raises(mpkit.LaunchError, match=r"dp\*pp\*cp\*tp = 2\*2\*1\*2 = 8 ranks, but world_size=4"):
        mpkit.launch(lambda ctx: build_mesh(Layout(2, 2, 2)), world_size=4, timeout=30)
