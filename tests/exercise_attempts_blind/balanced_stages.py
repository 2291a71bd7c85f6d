"""Blind attempts at balanced_stages (written without the reference)."""


def _bytes_per_param(optimizer):
    return 4 + 4 + (8 if optimizer == "adam" else 0)


# unusual: exact dynamic programme over split points; stages as range objects, bytes as a tuple
def dynamic_programme(layer_parameters, ranks, optimizer):
    n, per = len(layer_parameters), _bytes_per_param(optimizer)
    prefix = [0]
    for c in layer_parameters:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][i]: smallest heaviest load splitting the first i layers over k ranks
    best = [[inf] * (n + 1) for _ in range(ranks + 1)]
    cut = [[0] * (n + 1) for _ in range(ranks + 1)]
    best[0][0] = 0
    for k in range(1, ranks + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                load = max(best[k - 1][j], prefix[i] - prefix[j])
                if load < best[k][i]:
                    best[k][i], cut[k][i] = load, j
    bounds, i = [], n
    for k in range(ranks, 0, -1):
        bounds.append((cut[k][i], i))
        i = cut[k][i]
    stages = [range(lo, hi) for lo, hi in reversed(bounds)]
    return stages, tuple((prefix[hi] - prefix[lo]) * per for lo, hi in reversed(bounds))


# unusual: bisect the limit, then fill from the BACK (a different split with the same heaviest rank)
def fill_from_the_back(layer_parameters, ranks, optimizer):
    def needed(limit):
        count, load = 1, 0
        for c in reversed(layer_parameters):
            if load + c > limit:
                count, load = count + 1, 0
            load += c
        return count

    lo, hi = max(layer_parameters), sum(layer_parameters)
    while lo < hi:
        mid = (lo + hi) // 2
        if needed(mid) <= ranks:
            hi = mid
        else:
            lo = mid + 1
    stages, current, load = [], [], 0
    for i in range(len(layer_parameters) - 1, -1, -1):
        left_ranks = ranks - len(stages) - 1          # ranks still to fill before this one
        if current and (load + layer_parameters[i] > lo or i + 1 <= left_ranks):
            stages.append(current)
            current, load = [], 0
        current.insert(0, i)
        load += layer_parameters[i]
    stages.append(current)
    stages.reverse()
    per = _bytes_per_param(optimizer)
    return stages, [sum(layer_parameters[i] for i in s) * per for s in stages]


# wrong (not balanced): the same number of layers on each rank, whatever their size
def equal_layer_counts(layer_parameters, ranks, optimizer):
    n = len(layer_parameters)
    stages = [list(range(r * n // ranks, (r + 1) * n // ranks)) for r in range(ranks)]
    per = _bytes_per_param(optimizer)
    return stages, [sum(layer_parameters[i] for i in s) * per for s in stages]


# wrong: Adam counted as 12 bytes per parameter (forgets the gradient)
def adam_without_gradient(layer_parameters, ranks, optimizer):
    stages, _ = dynamic_programme(layer_parameters, ranks, optimizer)
    per = 4 + (8 if optimizer == "adam" else 0) + (0 if optimizer == "adam" else 4)
    return stages, [sum(layer_parameters[i] for i in s) * per for s in stages]


# wrong: SGD given a momentum buffer (4 more bytes per parameter)
def sgd_with_momentum(layer_parameters, ranks, optimizer):
    stages, _ = dynamic_programme(layer_parameters, ranks, optimizer)
    per = 4 + 4 + (8 if optimizer == "adam" else 4)
    return stages, [sum(layer_parameters[i] for i in s) * per for s in stages]


# wrong: greedy fill up to the average, leftovers all dumped on the last rank (and ranks may end empty)
def greedy_to_average(layer_parameters, ranks, optimizer):
    target = sum(layer_parameters) / ranks
    stages, current, load = [], [], 0
    for i, c in enumerate(layer_parameters):
        if current and load + c > target and len(stages) < ranks - 1:
            stages.append(current)
            current, load = [], 0
        current.append(i)
        load += c
    stages.append(current)
    while len(stages) < ranks:
        stages.append([])
    per = _bytes_per_param(optimizer)
    return stages, [sum(layer_parameters[i] for i in s) * per for s in stages]


# wrong (raises): off by one, reads layer i+1's size
def off_by_one_layer(layer_parameters, ranks, optimizer):
    stages, _ = dynamic_programme(layer_parameters, ranks, optimizer)
    per = _bytes_per_param(optimizer)
    return stages, [sum(layer_parameters[i + 1] for i in s) * per for s in stages]


CORRECT = [dynamic_programme, fill_from_the_back]
WRONG = [
    (equal_layer_counts, ("heaviest", "parameter count", "number of layers")),
    (adam_without_gradient, ("gradient", "16")),
    (sgd_with_momentum, ("sgd", "momentum")),
    (greedy_to_average, ("at least one", "empty", "heaviest")),
    (off_by_one_layer, ("index", "out of range")),
]
