"""Attempts for ring_all_gather(ctx, piece)."""
import torch
import torch.distributed as dist


# ---------------------------------------------------------------- correct
def ring_other_direction(ctx, piece):
    """Pieces travel leftwards: send to r-1, receive from r+1."""
    r, n = ctx.rank, ctx.world_size
    flat = piece.reshape(-1)
    k_ = flat.numel()
    out = torch.empty(n * k_, dtype=flat.dtype)
    slots = out.split(k_) if k_ > 0 else [out[:0]] * n
    slots[r].copy_(flat)
    for k in range(n - 1):
        a = dist.isend(slots[(r + k) % n], (r - 1) % n)
        b = dist.irecv(slots[(r + k + 1) % n], (r + 1) % n)
        a.wait()
        b.wait()
    return out


def blocking_by_parity_then_cat(ctx, piece):
    """Blocking send/recv ordered by rank parity; a dict of pieces, concatenated at the end."""
    r, n = ctx.rank, ctx.world_size
    have = {r: piece.reshape(-1).clone()}
    for k in range(n - 1):
        send_idx, recv_idx = (r - k) % n, (r - k - 1) % n
        buf = torch.empty_like(have[r])
        if r % 2 == 0:
            dist.send(have[send_idx], (r + 1) % n)
            dist.recv(buf, (r - 1) % n)
        else:
            dist.recv(buf, (r - 1) % n)
            dist.send(have[send_idx], (r + 1) % n)
        have[recv_idx] = buf
    return torch.cat([have[i] for i in range(n)])


CORRECT = [ring_other_direction, blocking_by_parity_then_cat]


# ---------------------------------------------------------------- wrong
def uses_all_gather(ctx, piece):
    parts = [torch.empty_like(piece) for _ in range(ctx.world_size)]
    dist.all_gather(parts, piece.contiguous())
    return torch.cat([p.reshape(-1) for p in parts])


def wrong_slot(ctx, piece):
    """Receives from r-1 but files the piece under the index of the other direction."""
    r, n = ctx.rank, ctx.world_size
    k_ = piece.numel()
    out = torch.empty(n * k_)
    slots = out.split(k_)
    slots[r].copy_(piece.reshape(-1))
    for k in range(n - 1):
        buf = torch.empty(k_)
        a = dist.isend(slots[(r - k) % n].clone(), (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        slots[(r + k + 1) % n].copy_(buf)
    return out


def not_flattened(ctx, piece):
    """Concatenates along dim 0 without flattening: a 2-D piece gives a 2-D result."""
    r, n = ctx.rank, ctx.world_size
    have = {r: piece.clone()}
    for k in range(n - 1):
        buf = torch.empty_like(piece)
        a = dist.isend(have[(r - k) % n].contiguous(), (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        have[(r - k - 1) % n] = buf
    return torch.cat([have[i] for i in range(n)])


def everyone_sends_first(ctx, piece):
    r, n = ctx.rank, ctx.world_size
    k_ = piece.numel()
    out = torch.empty(n * k_)
    slots = out.split(k_)
    slots[r].copy_(piece.reshape(-1))
    for k in range(n - 1):
        dist.send(slots[(r - k) % n], (r + 1) % n)
        dist.recv(slots[(r - k - 1) % n], (r - 1) % n)
    return out


def rotated_order(ctx, piece):
    """Concatenates in arrival order (own piece first) instead of rank order."""
    r, n = ctx.rank, ctx.world_size
    got = [piece.reshape(-1).clone()]
    for k in range(n - 1):
        buf = torch.empty_like(got[0])
        a = dist.isend(got[-1], (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        got.append(buf)
    return torch.cat(got)


def skips_a_neighbour(ctx, piece):
    """Sends to r+2 and receives from r-2 (not a ring for even N)."""
    r, n = ctx.rank, ctx.world_size
    k_ = piece.numel()
    out = torch.empty(n * k_)
    slots = out.split(k_)
    slots[r].copy_(piece.reshape(-1))
    for k in range(n - 1):
        a = dist.isend(slots[(r - 2 * k) % n], (r + 2) % n)
        b = dist.irecv(slots[(r - 2 * k - 2) % n], (r - 2) % n)
        a.wait()
        b.wait()
    return out


def sends_everything_each_step(ctx, piece):
    """Passes the whole buffer around each step (correct result, N times the traffic)."""
    r, n = ctx.rank, ctx.world_size
    k_ = piece.numel()
    out = torch.zeros(n * k_)
    out[r * k_:(r + 1) * k_] = piece.reshape(-1)
    for k in range(n - 1):
        buf = torch.empty_like(out)
        a = dist.isend(out.clone(), (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        mask = out == 0
        out[mask] = buf[mask]
    return out


def spins_forever(ctx, piece):
    """Rank 0 spins in a loop that never ends (waiting for a flag nobody sets); the others wait on it."""
    r, n = ctx.rank, ctx.world_size
    k_ = piece.numel()
    out = torch.empty(n * k_)
    slots = out.split(k_)
    slots[r].copy_(piece.reshape(-1))
    step = 0
    while step < n - 1:
        if r == 0 and step == 0:
            continue
        a = dist.isend(slots[(r - step) % n], (r + 1) % n)
        b = dist.irecv(slots[(r - step - 1) % n], (r - 1) % n)
        a.wait()
        b.wait()
        step += 1
    return out


WRONG = [
    (uses_all_gather, "send/recv"),
    (wrong_slot, "out of place"),
    (not_flattened, "1-d"),
    (everyone_sends_first, "deadlock"),
    (rotated_order, "out of place"),
    (skips_a_neighbour, "neighbour"),
    (sends_everything_each_step, "one chunk"),
    (spins_forever, "loop"),
]
