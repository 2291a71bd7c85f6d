"""Blind attempts (blind-b) at memory_per_gpu: written from the stub and hints only."""


# correct, unusual: a table of which states each stage shards, summed in a loop
def table(params, dp, pp, tp, zero_stage):
    psi = params / (pp * tp)
    parts = [(2, 3), (2, 2), (12, 1)]            # (bytes per parameter, first stage that shards it)
    return sum(b * psi / (dp if zero_stage >= first else 1) for b, first in parts)


# correct, unusual: closed forms per stage, returned as a float
def closed_forms(params, dp, pp, tp, zero_stage):
    psi = params / (pp * tp)
    return float([16 * psi, 4 * psi + 12 * psi / dp, 2 * psi + 14 * psi / dp, 16 * psi / dp][zero_stage])


# mistake: ZeRO-1 shards the gradients too (stages shifted by one)
def stages_shifted(params, dp, pp, tp, zero_stage):
    return closed_forms(params, dp, pp, tp, min(zero_stage + 1, 3) if zero_stage else 0)


# mistake: ZeRO shards over the whole world (dp·pp·tp) instead of the dp group
def shard_over_world(params, dp, pp, tp, zero_stage):
    return closed_forms(params * pp * tp, dp * pp * tp, pp, tp, zero_stage) / (pp * tp)


# mistake: forgets that pp and tp split the model first
def no_model_split(params, dp, pp, tp, zero_stage):
    return closed_forms(params, dp, 1, 1, zero_stage)


# mistake: Adam as 8 bytes (forgot the fp32 master copy of the weights)
def adam_eight_bytes(params, dp, pp, tp, zero_stage):
    psi = params / (pp * tp)
    p = 2 * psi / (dp if zero_stage >= 3 else 1)
    g = 2 * psi / (dp if zero_stage >= 2 else 1)
    o = 8 * psi / (dp if zero_stage >= 1 else 1)
    return p + g + o


# mistake (raises): stage 3 missing from the lookup (KeyError)
def no_stage_three(params, dp, pp, tp, zero_stage):
    psi = params / (pp * tp)
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / dp, 2: 2 * psi + 14 * psi / dp}[zero_stage]


CORRECT = [table, closed_forms]
WRONG = [
    (stages_shifted, ("stage", "zero-1", "gradient")),
    (shard_over_world, ("dp group", "within", "world")),
    (no_model_split, ("pp·tp", "pp*tp", "split", "pp and tp")),
    (adam_eight_bytes, ("12", "master", "fp32", "optimizer")),
    (no_stage_three, ("stage 3", "keyerror", "zero_stage")),
]
