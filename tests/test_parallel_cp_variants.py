"""Context parallelism's variants (issue 45), each against attention on one device, forward and
backward: the log-sum-exp (``return_lse=True``, with a gradient through it), the [b, s, h, d] and
packed varlen ([tokens, h, d] with ``cu_seqlens``) layouts, the zigzag, contiguous and striped
splits, ``softmax_scale``, a sliding window, grouped-query K/V, the all-gather (Llama 3) variant,
Ulysses with a head count the group does not divide (DeepSpeed's uneven split) and Ulysses x
ring (USP, yunchang's ``LongContextAttention``) on a 2-D group. One launched world per world size
runs every case; each test looks its case up.

The reference is attention written out on one device in float64 with the mask every case
implies (same sequence, causal, inside the window). Tolerance: the ranks compute in float32 and
merge blocks by log-sum-exp in another order than one softmax (measured <= 2e-6 on values of
order 1); a lost, doubled or wrongly masked block is O(0.1).
"""
import pytest
import torch

import mpkit
from mpkit.parallel import (all_gather_attention, ring_attention, shard_sequence, ulysses_attention,
                            usp_attention)
from mpkit.parallel.sequence_split import placement, resolve_split

ATOL = 1e-5
B, H, D = 2, 4, 8

# name: (function, keywords, sequence lengths of the packed batch or one length, query heads, K/V heads)
CASES = {
    "ring zigzag causal bhsd": ("ring", dict(split="zigzag"), 32, H, H),
    "ring contiguous full bshd": ("ring", dict(split="contiguous", causal=False, layout="bshd"), 32, H, H),
    "ring striped causal bshd": ("ring", dict(split="striped", layout="bshd"), 32, H, H),
    "ring varlen zigzag thd": ("ring", dict(split="zigzag", layout="thd"), [8, 16, 8], H, H),
    "ring varlen contiguous full thd": ("ring", dict(split="contiguous", causal=False, layout="thd"), [12, 4, 16], H, H),
    "ring window scale gqa": ("ring", dict(window_size=(5, 0), softmax_scale=0.3), 32, H, 2),
    "ring window both sides": ("ring", dict(causal=False, window_size=(3, 6), split="striped"), 32, H, H),
    "all-gather zigzag causal": ("all-gather", dict(), 32, H, H),
    "all-gather varlen thd gqa": ("all-gather", dict(layout="thd"), [8, 24], H, 1),
    "ulysses varlen thd": ("ulysses", dict(layout="thd"), [8, 16, 8], H, H),
    "ulysses uneven heads bshd": ("ulysses", dict(layout="bshd"), 32, 5, 5),  # 3+2, or 2+1+1+1
    "ulysses gqa striped": ("ulysses", dict(split="striped", window_size=(4, 0)), 32, 8, 4),
}
FUNCTIONS = {"ring": ring_attention, "all-gather": all_gather_attention, "ulysses": ulysses_attention}


def lengths_of(spec):
    return spec if isinstance(spec, list) else [spec]


def whole_inputs(spec, heads, kv_heads, seed=0):
    """q, k, v, dout [b, h, T, d] and dlse [b, h, T] in float64, T all tokens in packed order (b=1 for varlen)."""
    g = torch.Generator().manual_seed(seed)
    b, t = (1, sum(spec)) if isinstance(spec, list) else (B, spec)
    q, dout = (torch.randn(b, heads, t, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(b, kv_heads, t, D, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, dout, torch.randn(b, heads, t, generator=g, dtype=torch.float64)


def to_layout(t, layout):
    """[b, h, T, d] (or [b, h, T]) into the case's layout."""
    if layout == "thd":
        return t.squeeze(0).transpose(0, 1) if t.dim() == 4 else t.squeeze(0)
    return t.transpose(1, 2) if layout == "bshd" and t.dim() == 4 else t


def reference(spec, kw, heads, kv_heads):
    """Output, log-sum-exp and gradients of attention written out in float64 (T tokens in packed order)."""
    q, k, v, dout, dlse = whole_inputs(spec, heads, kv_heads)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    seq = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths_of(spec))])
    pos = torch.cat([torch.arange(n) for n in lengths_of(spec)])
    back = pos[:, None] - pos[None, :]
    mask = seq[:, None] == seq[None, :]
    left, right = kw.get("window_size", (-1, -1))
    if kw.get("causal", True):
        mask &= back >= 0
    if left >= 0:
        mask &= back <= left
    if right >= 0:
        mask &= back >= -right
    scale = kw.get("softmax_scale", D ** -0.5)
    group = heads // kv_heads
    s = (q @ k.repeat_interleave(group, 1).transpose(-2, -1) * scale).masked_fill(~mask, float("-inf"))
    lse = s.logsumexp(-1)
    out = torch.softmax(s, -1) @ v.repeat_interleave(group, 1)
    ((out * dout).sum() + (lse * dlse).sum()).backward()
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def local_rows(spec, kw, group=None, ulysses_group=None):
    tokens = sum(lengths_of(spec))
    cu = [0, *torch.tensor(spec).cumsum(0).tolist()] if isinstance(spec, list) else None
    return shard_sequence(torch.arange(tokens), group, dim=0, split=kw.get("split"), cu_seqlens=cu,
                          ulysses_group=ulysses_group)


def run_case(spec, kw, heads, kv_heads, attend, group=None, ulysses_group=None):
    """This rank's output, log-sum-exp and gradients (float32 inputs, in the case's layout)."""
    layout = kw.get("layout", "bhsd")
    rows = local_rows(spec, kw, group, ulysses_group)
    q, k, v, dout, dlse = (to_layout(t.index_select(2, rows).float(), layout) for t in whole_inputs(spec, heads, kv_heads))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    extra = {"cu_seqlens": [0, *torch.tensor(spec).cumsum(0).tolist()]} if isinstance(spec, list) else {}
    out, lse = attend(q, k, v, return_lse=True, **kw, **extra)
    ((out * dout).sum() + (lse * dlse).sum()).backward()
    return [out.detach(), lse.detach(), q.grad, k.grad, v.grad], lse.dtype


def _all_cases(ctx):
    return {name: run_case(spec, kw, heads, kv_heads, FUNCTIONS[kind])
            for name, (kind, kw, spec, heads, kv_heads) in CASES.items()}


@pytest.fixture(scope="module", params=[2, 4])
def world(request):
    return request.param, mpkit.launch(_all_cases, request.param, timeout=200)


def rows_of(spec, kw, n, rank):
    """The packed rows rank ``rank`` of ``n`` holds (what ``shard_sequence`` keeps), without a group."""
    return placement(tuple(lengths_of(spec)), n, rank, resolve_split(kw.get("split"), None)).rows


def assert_matches(got, spec, kw, heads, kv_heads, rows):
    layout = kw.get("layout", "bhsd")
    for what, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, reference(spec, kw, heads, kv_heads)):
        w = to_layout(w.index_select(2, rows), layout)
        assert g.shape == w.shape, what
        assert (g.double() - w).abs().max() <= ATOL, what


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", list(CASES))
def test_variant_equals_attention_on_one_device(world, case):
    n, results = world
    kind, kw, spec, heads, kv_heads = CASES[case]
    for rank, by_case in enumerate(results):
        got, lse_dtype = by_case[case]
        assert lse_dtype == torch.float32  # the statistics are fp32 (here the inputs are too)
        assert_matches(got, spec, kw, heads, kv_heads, rows_of(spec, kw, n, rank))


# ---- Ulysses x ring (USP) on a 2-D group: yunchang's test/test_hybrid_attn.py, ported ----
# Its groups (set_seq_parallel_pg(ulysses=2, ring=2, use_ulysses_low=True)): Ulysses groups of
# consecutive ranks {0, 1} {2, 3}, ring groups {0, 2} {1, 3}; its shards (EXTRACT_FUNC_DICT): "basic"
# = block `rank` of the world, "zigzag" = chunks r and 2R-1-r of the ring's 2R, cut into U parts.
# Its sizes scaled down (seq 1024 -> 32, 32 heads -> 4, d 64 -> 8) and float32 instead of bf16, so
# the tolerance is ours (above) rather than its atol=0.1.
USP_CASES = {"basic causal": dict(split="contiguous", layout="bshd"),
             "basic full": dict(split="contiguous", causal=False, layout="bshd"),
             "zigzag causal": dict(split="zigzag", layout="bshd"),
             "zigzag causal gqa": dict(split="zigzag", layout="bshd")}


def _usp(ctx):
    import torch.distributed as dist
    groups = {name: [dist.new_group(r) for r in ranks] for name, ranks in
              (("ulysses", [[0, 1], [2, 3]]), ("ring", [[0, 2], [1, 3]]))}
    ulysses, ring = groups["ulysses"][ctx.rank // 2], groups["ring"][ctx.rank % 2]
    out = {}
    for name, kw in USP_CASES.items():
        kv = 2 if "gqa" in name else H
        got, _ = run_case(32, kw, H, kv, lambda *a, **k: usp_attention(*a, ulysses, ring, **k), ring, ulysses)
        out[name] = got, local_rows(32, kw, ring, ulysses)
    return out


@pytest.mark.timeout(120)
def test_ulysses_times_ring_equals_attention_on_one_device():
    for rank, by_case in enumerate(mpkit.launch(_usp, 4, timeout=100)):
        for name, kw in USP_CASES.items():
            got, rows = by_case[name]
            if kw["split"] == "contiguous":  # yunchang's basic_extract_local: block `rank` of the world
                assert rows.tolist() == list(range(rank * 8, rank * 8 + 8))
            else:  # zigzag_extract_local: ring rank r = rank // 2 holds chunks r, 3-r of 4; Ulysses rank its half
                r, u = rank // 2, rank % 2
                assert rows.tolist() == [*range(8 * r, 8 * r + 8), *range(8 * (3 - r), 8 * (3 - r) + 8)][8 * u:8 * u + 8]
            assert_matches(got, 32, kw, H, 2 if "gqa" in name else H, rows)


# ---- refused with the reason (caller side: no rank left waiting) ----

def _refusals(ctx):
    from mpkit.parallel import all_to_all
    from parallel_models import raised
    q = torch.randn(1, 4, 8, 8)
    return {"dropout": raised(lambda: ring_attention(q, q, q, dropout_p=0.1)),
            "layout": raised(lambda: ring_attention(q, q, q, layout="sbhd")),
            "heads": raised(lambda: ulysses_attention(q, q[:, :1], q[:, :1])),
            "gqa": raised(lambda: ring_attention(q, q[:, :3], q[:, :3])),
            "window": raised(lambda: ring_attention(q, q, q, window_size=(-2, 0))),
            "cu_seqlens": raised(lambda: ring_attention(q[0].transpose(0, 1), q[0].transpose(0, 1), q[0].transpose(0, 1),
                                                        layout="thd", cu_seqlens=[0, 4, 12])),
            "split": raised(lambda: ring_attention(q, q, q, split="zigzag", balanced=False)),
            "sizes": raised(lambda: ring_attention(q[:, :, :3], q[:, :, :3], q[:, :, :3])),
            "all-to-all": raised(lambda: all_to_all(torch.ones(3, 2), 0, 1))}


@pytest.mark.timeout(60)
def test_unsupported_or_impossible_inputs_are_refused_with_the_fix():
    for replies in mpkit.launch(_refusals, 2, timeout=50):
        assert "dropout_p=0.1 is not supported" in replies["dropout"]
        assert "layout='sbhd' is unknown" in replies["layout"]
        # 1 K/V head over 2 ranks: a rank would have none; the group sizes that work are named
        assert "only 1 key/value heads" in replies["heads"] and "at most 1 ranks" in replies["heads"]
        assert "4 query heads cannot share 3 key/value heads" in replies["gqa"]
        assert "window_size=(-2, 0)" in replies["window"]
        assert "cu_seqlens=[0, 4, 12] describes 12 tokens, but this rank holds 8 of 2 equal shares" in replies["cu_seqlens"]
        assert "balanced=False contradicts split='zigzag'" in replies["split"]
        assert "seq_len=6 cannot be cut into 4 equal chunks" in replies["sizes"]
        # once read "all-to-all all-to-all forward: ..."; now it names the uneven sizes that would work
        assert replies["all-to-all"].startswith("ValueError: all-to-all: dimension 0 of size 3 cannot be cut into 2")
        assert "scatter_sizes=[2, 1]" in replies["all-to-all"]
