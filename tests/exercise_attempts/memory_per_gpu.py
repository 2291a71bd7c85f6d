"""Attempts for memory_per_gpu(params, dp, pp, tp, zero_stage)."""


# ---------------------------------------------------------------- correct
def table_by_stage(params, dp, pp, tp, zero_stage):
    psi = params / (pp * tp)
    return {0: 16 * psi,
            1: 4 * psi + 12 * psi / dp,
            2: 2 * psi + 14 * psi / dp,
            3: 16 * psi / dp}[zero_stage]


def sharded_states_sum(params, dp, pp, tp, zero_stage):
    """Each state (bytes, first stage that shards it) summed; integer-exact where it divides."""
    total = 0
    for nbytes, shard_from in ((2, 3), (2, 2), (12, 1)):
        denom = pp * tp * (dp if zero_stage >= shard_from else 1)
        b = nbytes * params
        total += b // denom if b % denom == 0 else b / denom
    return total


CORRECT = [table_by_stage, sharded_states_sum]


# ---------------------------------------------------------------- wrong
def zero1_divides_everything(params, dp, pp, tp, zero_stage):
    psi = params / (pp * tp)
    return 16 * psi if zero_stage == 0 else 16 * psi / dp


def forgot_model_parallel_split(params, dp, pp, tp, zero_stage):
    psi = params
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / dp, 2: 2 * psi + 14 * psi / dp, 3: 16 * psi / dp}[zero_stage]


def stage2_shards_params(params, dp, pp, tp, zero_stage):
    psi = params / (pp * tp)
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / dp, 2: 16 * psi / dp, 3: 16 * psi / dp}[zero_stage]


def stage3_keeps_params(params, dp, pp, tp, zero_stage):
    psi = params / (pp * tp)
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / dp, 2: 2 * psi + 14 * psi / dp,
            3: 2 * psi + 14 * psi / dp}[zero_stage]


def optimizer_eight_bytes(params, dp, pp, tp, zero_stage):
    """Forgets the fp32 master copy: Adam 8 bytes instead of 12."""
    psi = params / (pp * tp)
    return {0: 12 * psi, 1: 4 * psi + 8 * psi / dp, 2: 2 * psi + 10 * psi / dp, 3: 12 * psi / dp}[zero_stage]


def stage0_divided_by_dp(params, dp, pp, tp, zero_stage):
    """Treats plain data parallelism as if it split the model across dp."""
    psi = params / (pp * tp * dp)
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / dp, 2: 2 * psi + 14 * psi / dp, 3: 16 * psi / dp}[zero_stage]


def shards_over_whole_world(params, dp, pp, tp, zero_stage):
    """ZeRO shards over dp*pp*tp instead of dp."""
    psi = params / (pp * tp)
    w = dp * pp * tp
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / w, 2: 2 * psi + 14 * psi / w, 3: 16 * psi / w}[zero_stage]


WRONG = [
    (zero1_divides_everything, "optimizer"),
    (forgot_model_parallel_split, "pp"),
    (stage2_shards_params, "only zero-3 the parameters"),
    (stage3_keeps_params, "zero-3 shards the parameters"),
    (optimizer_eight_bytes, "12"),
    (stage0_divided_by_dp, "stage 0 shards nothing"),
    (shards_over_whole_world, "dp"),
]
