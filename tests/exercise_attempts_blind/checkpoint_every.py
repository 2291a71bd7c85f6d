"""Blind attempts (blind-b) at checkpoint_every: written from the stub and hints only."""
import math


# correct, unusual: nearest whole number chosen by comparing floor and ceil
def floor_or_ceil(step_seconds, checkpoint_seconds, mtbf_seconds):
    x = math.sqrt(2 * checkpoint_seconds * mtbf_seconds) / step_seconds
    lo = math.floor(x)
    every = max(1, lo if x - lo <= math.ceil(x) - x else math.ceil(x))
    tau = every * step_seconds
    return every, checkpoint_seconds / tau + tau / (2 * mtbf_seconds)


# correct, unusual: round half up with int(x + 0.5), returned as a list
def half_up(step_seconds, checkpoint_seconds, mtbf_seconds):
    every = max(1, int((2 * checkpoint_seconds * mtbf_seconds) ** 0.5 / step_seconds + 0.5))
    tau = every * step_seconds
    return every, checkpoint_seconds / tau + tau / (2 * mtbf_seconds)


# mistake: rounds down instead of to the nearest
def rounds_down(step_seconds, checkpoint_seconds, mtbf_seconds):
    every = max(1, int(math.sqrt(2 * checkpoint_seconds * mtbf_seconds) / step_seconds))
    tau = every * step_seconds
    return every, checkpoint_seconds / tau + tau / (2 * mtbf_seconds)


# mistake: returns Young's interval in seconds, not in steps
def seconds_not_steps(step_seconds, checkpoint_seconds, mtbf_seconds):
    tau = max(1, round(math.sqrt(2 * checkpoint_seconds * mtbf_seconds)))
    return tau, checkpoint_seconds / tau + tau / (2 * mtbf_seconds)


# mistake: sqrt(C·M), the factor 2 forgotten
def no_factor_two(step_seconds, checkpoint_seconds, mtbf_seconds):
    every = max(1, round(math.sqrt(checkpoint_seconds * mtbf_seconds) / step_seconds))
    tau = every * step_seconds
    return every, checkpoint_seconds / tau + tau / (2 * mtbf_seconds)


# mistake: the waste at Young's exact τ, not at the rounded interval
def waste_at_exact_tau(step_seconds, checkpoint_seconds, mtbf_seconds):
    tau = math.sqrt(2 * checkpoint_seconds * mtbf_seconds)
    return max(1, round(tau / step_seconds)), checkpoint_seconds / tau + tau / (2 * mtbf_seconds)


# mistake (raises): no max(1, ...), so a long step gives 0 steps and a division by zero
def no_minimum(step_seconds, checkpoint_seconds, mtbf_seconds):
    every = round(math.sqrt(2 * checkpoint_seconds * mtbf_seconds) / step_seconds)
    tau = every * step_seconds
    return every, checkpoint_seconds / tau + tau / (2 * mtbf_seconds)


CORRECT = [floor_or_ceil, half_up]
WRONG = [
    (rounds_down, ("nearest", "round", "floor")),
    (seconds_not_steps, ("steps", "seconds", "step_seconds", "step time")),
    (no_factor_two, ("2·c·m", "2*c*m", "young", "factor")),
    (waste_at_exact_tau, ("rounded", "τ", "tau", "interval")),
    (no_minimum, ("at least 1", "zero", "division")),
]
