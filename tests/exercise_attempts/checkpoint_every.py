"""Attempts for checkpoint_every(step_seconds, checkpoint_seconds, mtbf_seconds)."""
import math


# ---------------------------------------------------------------- correct
def with_math(step_seconds, checkpoint_seconds, mtbf_seconds):
    tau = math.sqrt(2 * checkpoint_seconds * mtbf_seconds)
    steps = max(1, int(round(tau / step_seconds)))
    seconds = steps * step_seconds
    return steps, checkpoint_seconds / seconds + seconds / (2 * mtbf_seconds)


def nearest_of_two(step_seconds, checkpoint_seconds, mtbf_seconds):
    """floor or ceil, whichever is nearer Young's interval (a list, not a tuple)."""
    exact = (2 * checkpoint_seconds * mtbf_seconds) ** 0.5 / step_seconds
    low, high = max(1, math.floor(exact)), max(1, math.ceil(exact))
    steps = low if exact - low <= high - exact else high
    tau = steps * step_seconds
    return [steps, (2 * mtbf_seconds * checkpoint_seconds + tau * tau) / (2 * mtbf_seconds * tau)]


CORRECT = [with_math, nearest_of_two]


# ---------------------------------------------------------------- wrong
def forgot_the_two(step_seconds, checkpoint_seconds, mtbf_seconds):
    steps = max(1, round(math.sqrt(checkpoint_seconds * mtbf_seconds) / step_seconds))
    tau = steps * step_seconds
    return steps, checkpoint_seconds / tau + tau / (2 * mtbf_seconds)


def returns_seconds(step_seconds, checkpoint_seconds, mtbf_seconds):
    tau = math.sqrt(2 * checkpoint_seconds * mtbf_seconds)
    return round(tau), checkpoint_seconds / tau + tau / (2 * mtbf_seconds)


def loses_the_whole_interval(step_seconds, checkpoint_seconds, mtbf_seconds):
    steps = max(1, round(math.sqrt(2 * checkpoint_seconds * mtbf_seconds) / step_seconds))
    tau = steps * step_seconds
    return steps, checkpoint_seconds / tau + tau / mtbf_seconds


def only_saving_cost(step_seconds, checkpoint_seconds, mtbf_seconds):
    steps = max(1, round(math.sqrt(2 * checkpoint_seconds * mtbf_seconds) / step_seconds))
    return steps, checkpoint_seconds / (steps * step_seconds)


def no_floor_of_one(step_seconds, checkpoint_seconds, mtbf_seconds):
    steps = round(math.sqrt(2 * checkpoint_seconds * mtbf_seconds) / step_seconds)
    tau = max(steps, 1e-9) * step_seconds
    return steps, checkpoint_seconds / tau + tau / (2 * mtbf_seconds)


WRONG = [
    (forgot_the_two, "√(2·c·m)"),
    (returns_seconds, "seconds"),
    (loses_the_whole_interval, "τ/2"),
    (only_saving_cost, "τ/(2m)"),
    (no_floor_of_one, "expected"),
]
