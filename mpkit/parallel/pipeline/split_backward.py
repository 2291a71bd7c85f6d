"""A stage's backward in two parts, as zero-bubble schedules run it (Qi et al. 2024):

- **B** (``backward_input``): only the gradient w.r.t. the stage's input — what the previous
  stage is waiting for. On its way autograd passes, for every weight, the node where that weight's
  path leaves the input's path (a Linear's ``AddmmBackward``); B keeps the gradient arriving there.
- **W** (``backward_weight``): from those kept gradients to the weights only, later, where the
  rank would otherwise wait. It runs just the weights' part of those nodes (``x^T · dy``), not
  the input path again.

Each weight is its own group with its own nodes (``AddmmBackward`` of layer 2 must not feed
layer 1's weight through the input path a second time: layer 1's own node already carries that
gradient). The same split as ``torch.distributed.pipelining``'s ``stage_backward_input`` and
``stage_backward_weight``, written with public autograd APIs (``Node.register_prehook``,
``GradientEdge``); ``tests/test_pipeline_torch_cases.py`` checks the gradients against torch's.
"""
from __future__ import annotations

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge


def _children(node):
    return [child for child, _ in node.next_functions if child is not None]


def _reaching(root, targets) -> set:
    """Nodes under ``root`` (``root`` included) from which one of ``targets`` is reachable."""
    memo, order, stack = {}, [], [root]
    while stack:  # iterative post-order: stage graphs can be deeper than Python's recursion limit
        node = stack.pop()
        if node in memo:
            continue
        memo[node] = None
        order.append(node)
        stack.extend(_children(node))
    reach = set()
    for node in reversed(order):  # children before parents
        if node in targets or any(child in reach for child in _children(node)):
            reach.add(node)
    return reach


def backward_input(out, grad, x, weights):
    """B: returns (the gradient w.r.t. ``x``, what W needs). ``out``: the stage's output (or loss);
    ``grad``: the gradient w.r.t. it (None for a loss); ``weights``: the stage's trainable ones."""
    root = out.grad_fn
    on_path = _reaching(root, {x.grad_fn})  # the nodes B runs: from the output down to the input
    groups = []  # per weight: the nodes where its path leaves the input's path, and their gradients
    for w in weights:
        reach = _reaching(root, {get_gradient_edge(w).node})
        leaving = [node for node in on_path if any(child not in on_path and child in reach
                                                   for child in _children(node))]
        if leaving:
            groups.append(([w], leaving, {}))
    handles = []
    for _, nodes, kept in groups:
        for node in nodes:
            def keep(grad_outputs, node=node, kept=kept):
                kept[node] = grad_outputs
            handles.append(node.register_prehook(keep))
    try:
        (dx,) = torch.autograd.grad(out, x, grad, retain_graph=True)
    finally:
        for handle in handles:
            handle.remove()
    return dx, groups


def backward_weight(groups) -> None:
    """W: accumulate each weight's gradient into ``.grad`` from the gradients B kept."""
    for params, nodes, kept in groups:
        edges, grads = [], []
        for node in nodes:
            for i, g in enumerate(kept.get(node, ())):
                if g is not None:
                    edges.append(GradientEdge(node, i))
                    grads.append(g)
        if edges:
            torch.autograd.backward(edges, grads, inputs=params, retain_graph=True)
