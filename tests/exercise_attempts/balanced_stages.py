"""Attempts for balanced_stages(layer_parameters, ranks, optimizer) -> (stages, bytes_per_rank)."""
import itertools

import torch

PER = {"adam": 16, "sgd": 8}


def _bytes(sizes, stages, per):
    return [sum(sizes[i] for i in stage) * per for stage in stages]


# ---------------------------------------------------------------- correct
def dynamic_programming(layer_parameters, ranks, optimizer):
    """best[k][i]: the smallest peak for the first i layers on k ranks; ranges as stages, a tuple back."""
    n, sizes = len(layer_parameters), layer_parameters
    prefix = [0, *itertools.accumulate(sizes)]
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(ranks + 1)]
    cut = [[0] * (n + 1) for _ in range(ranks + 1)]
    best[0][0] = 0
    for k in range(1, ranks + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                peak = max(best[k - 1][j], prefix[i] - prefix[j])
                if peak < best[k][i]:
                    best[k][i], cut[k][i] = peak, j
    bounds, i = [n], n
    for k in range(ranks, 0, -1):
        i = cut[k][i]
        bounds.append(i)
    bounds.reverse()
    stages = [range(a, b) for a, b in zip(bounds, bounds[1:])]
    return stages, tuple(_bytes(sizes, stages, PER[optimizer]))


def brute_force(layer_parameters, ranks, optimizer):
    """Every way to place ranks-1 cuts; the first with the smallest heaviest stage (numpy-free, small models)."""
    n = len(layer_parameters)
    best = None
    for cuts in itertools.combinations(range(1, n), ranks - 1):
        bounds = [0, *cuts, n]
        stages = [list(range(a, b)) for a, b in zip(bounds, bounds[1:])]
        peak = max(sum(layer_parameters[i] for i in s) for s in stages)
        if best is None or peak < best[0]:
            best = (peak, stages)
    per = 4 + 4 + (8 if optimizer == "adam" else 0)
    return best[1], [int(torch.tensor([layer_parameters[i] for i in s]).sum()) * per for s in best[1]]


CORRECT = [dynamic_programming, brute_force]


# ---------------------------------------------------------------- wrong
def equal_layer_count(layer_parameters, ranks, optimizer):
    """Right bytes for a valid split, but the same number of layers per rank: the heaviest rank is over the target."""
    stages = [t.tolist() for t in torch.arange(len(layer_parameters)).tensor_split(ranks)]
    return stages, _bytes(layer_parameters, stages, PER[optimizer])


def greedy_average(layer_parameters, ranks, optimizer):
    """Starts a new rank when the next layer would pass the average: misses the optimum."""
    target = sum(layer_parameters) / ranks
    stages, total = [[]], 0
    for i, size in enumerate(layer_parameters):
        if stages[-1] and total + size > target and len(stages) < ranks:
            stages.append([])
            total = 0
        stages[-1].append(i)
        total += size
    return stages, _bytes(layer_parameters, stages, PER[optimizer])


def weights_only(layer_parameters, ranks, optimizer):
    """Balanced split, but counts 4 bytes per parameter (no gradient, no optimizer state)."""
    stages, _ = dynamic_programming(layer_parameters, ranks, optimizer)
    return stages, _bytes(layer_parameters, stages, 4)


def adam_state_for_sgd(layer_parameters, ranks, optimizer):
    """Counts Adam's two moments whatever the optimizer."""
    stages, _ = dynamic_programming(layer_parameters, ranks, optimizer)
    return stages, _bytes(layer_parameters, stages, 16)


def round_robin(layer_parameters, ranks, optimizer):
    """Layer i on rank i % ranks: not consecutive."""
    stages = [list(range(r, len(layer_parameters), ranks)) for r in range(ranks)]
    return stages, _bytes(layer_parameters, stages, PER[optimizer])


def stages_only(layer_parameters, ranks, optimizer):
    """Returns the stages and forgets the bytes."""
    return dynamic_programming(layer_parameters, ranks, optimizer)[0]


WRONG = [
    (equal_layer_count, "by layer count"),
    (greedy_average, "lighter heaviest rank"),
    (weights_only, "only the weights"),
    (adam_state_for_sgd, "plain sgd"),
    (round_robin, "consecutive"),
    (stages_only, "two values"),
]
