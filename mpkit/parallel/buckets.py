"""Flat buffers of gradients or parameters: the bucket plan ``DataParallel`` reduces (and the cost
model prices, on meta tensors), and the flat views ``DataParallel``'s buckets and
``ShardedOptimizer``'s shards are made of. Sizes count MiB as DDP's ``bucket_cap_mb`` does."""
from __future__ import annotations

import math

import torch

from mpkit.whole import is_number

MiB = 2**20  # DDP's bucket_cap_mb counts MiB (bucket_cap_mb * 1024 * 1024 bytes); so does bucket_mb
DEFAULT_BUCKET_MB = 25.0  # DDP's default bucket_cap_mb
FIRST_BUCKET_MB = 1.0  # DDP caps its first bucket at 1 MiB (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)


def plan_buckets(params, cap_bytes: int, first_cap: int | None = None) -> list[list]:
    """The bucket plan: reverse parameter order, a new bucket whenever the next tensor would
    overflow ``cap_bytes`` (a tensor bigger than the cap gets a bucket of its own; cap 0 = one
    bucket per tensor) or has another dtype (a bucket is one flat tensor: a bf16 model's fp32
    norms go apart, as in DDP). ``first_cap``: a smaller cap for the first bucket (torch DDP's
    1 MiB, so communication starts early). Works on meta tensors too, so the cost model prices
    the very buckets a run reduces."""
    buckets, current, size = [], [], 0
    cap = cap_bytes if first_cap is None else first_cap
    for p in reversed(list(params)):
        nbytes = p.numel() * p.element_size()
        if current and (size + nbytes > cap or p.dtype != current[0].dtype):
            buckets.append(current)
            current, size, cap = [], 0, cap_bytes
        current.append(p)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def flat_views(tensors, numel=None):
    """One zeroed flat buffer of ``numel`` (default: their total) elements and a view shaped like
    each tensor, back to back; the tail past their total is padding."""
    tensors = list(tensors)
    total = sum(t.numel() for t in tensors)
    flat = torch.zeros(total if numel is None else numel, dtype=tensors[0].dtype, device=tensors[0].device)
    views, offset = [], 0
    for t in tensors:
        views.append(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return flat, views


def bucket_caps(bucket_mb: float, first_bucket_mb: float = FIRST_BUCKET_MB) -> tuple[int, int]:
    """(bytes cap of every bucket, of the first one) for ``plan_buckets``: the first is never larger."""
    return int(bucket_mb * MiB), int(min(first_bucket_mb, bucket_mb) * MiB)


def check_bucket_mb(bucket_mb, name="bucket_mb") -> float:
    if not is_number(bucket_mb) or not 0 <= bucket_mb < math.inf:
        raise ValueError(f"{name}={bucket_mb!r} must be a number of MiB >= 0 (0 = one all-reduce per parameter "
                         f"tensor, 25 = DDP's default)")
    return float(bucket_mb)
