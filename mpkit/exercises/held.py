"""What a forward leaves alive for its backward, by storage: the tensors autograd saved (seen
through ``torch.autograd.graph.saved_tensors_hooks`` around the forward) and those kept on the
autograd contexts of the output's graph (``ctx.full = w`` in a custom Function) or on objects the
checker names (a module's attributes).

Memory is what a storage holds *now*: FSDP's trick of freeing a saved parameter by resizing its
storage to zero counts as freed. Storages alive before the forward (parameters, shards, the
input) are the caller's to leave out; RNG states (uint8) are bookkeeping, not activations.
"""
from __future__ import annotations

import torch


def _tensors(value, depth=2):
    if isinstance(value, torch.Tensor):
        yield value
    elif depth and isinstance(value, (list, tuple, set)):
        for item in value:
            yield from _tensors(item, depth - 1)
    elif depth and isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item, depth - 1)


def storage_key(t: torch.Tensor):
    return t.untyped_storage().data_ptr(), t.device


class Held:
    """``with Held() as held: out = forward(...)``, then ``held.storages(out, ...)``."""

    def __init__(self):
        self.saved, self._hooks = [], torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t):
        self.saved.append(t)
        return t

    def __enter__(self) -> "Held":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)

    def storages(self, output, owners=(), before=(), stop=None) -> dict:
        """{storage key: bytes held now} for what is saved or kept, except the storages in
        ``before``; ``owners``: objects whose attributes count as kept; ``stop``: a tensor whose
        graph the walk does not enter (the part before the checked forward)."""
        found = list(self.saved)
        for owner in owners:
            found += [t for value in vars(owner).values() for t in _tensors(value)]
        seen, todo = set(), [output.grad_fn] if isinstance(output, torch.Tensor) else []
        end = stop.grad_fn if isinstance(stop, torch.Tensor) else None
        while todo:
            node = todo.pop()
            if node is None or node in seen or node is end:
                continue
            seen.add(node)
            found += [t for value in getattr(node, "__dict__", {}).values() for t in _tensors(value)]
            todo += [child for child, _ in node.next_functions]
        skip = {storage_key(t) for t in before}
        return {storage_key(t): t.untyped_storage().nbytes() for t in found
                if t.dtype != torch.uint8 and storage_key(t) not in skip}

    def release(self) -> None:
        self.saved = []
