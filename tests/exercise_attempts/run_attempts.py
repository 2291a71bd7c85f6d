"""Run every attempt of one (or every) exercise module through mpkit.exercises.check, one at a time.

    python tests/exercise_attempts/run_attempts.py [exercise ...]

Writes results/<exercise>.json and prints one line per attempt."""
import importlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

EXERCISES = ["average_gradients", "bucketed_gradients", "layerwise_step", "f_and_g", "megatron_mlp",
             "gpipe_schedule", "one_f_one_b_schedule", "ring_reduce_scatter", "ring_all_gather",
             "ring_all_reduce", "zero1_step", "rank_coordinates", "process_groups", "memory_per_gpu"]


def name_of(obj):
    if isinstance(obj, tuple):
        return getattr(obj, "_attempt_name", None) or "+".join(o.__name__ for o in obj)
    return obj.__name__


def run(ex, only=None):
    from mpkit.exercises import check
    mod = importlib.import_module(ex)
    out = []
    items = [("correct", a, None) for a in mod.CORRECT] + [("wrong", a, kw) for a, kw in mod.WRONG]
    for kind, attempt, kw in items:
        nm = name_of(attempt)
        if only and nm not in only:
            continue
        t0 = time.time()
        try:
            r = check(ex, attempt, lang="en", record=False)
            passed, msg = r.passed, r.message
        except BaseException as e:  # noqa: BLE001
            passed, msg = None, f"CHECK RAISED {type(e).__name__}: {e}"
        dt = time.time() - t0
        if kind == "correct":
            ok = passed is True
        else:
            ok = passed is False and kw.lower() in (msg or "").lower()
        rec = dict(exercise=ex, kind=kind, attempt=nm, keyword=kw, passed=passed, seconds=round(dt, 1),
                   ok=ok, message=msg)
        out.append(rec)
        flag = "OK  " if ok else "FLAG"
        print(f"{flag} {ex:22s} {kind:7s} {nm:40s} passed={passed} {dt:5.1f}s kw={kw!r}", flush=True)
        if not ok:
            print("     " + (msg or "").replace("\n", "\n     ")[:3000], flush=True)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    suffix = "" if not only else ".partial"
    with open(os.path.join(HERE, "results", ex + suffix + ".json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    only = None
    if "--only" in args:
        i = args.index("--only")
        only = set(args[i + 1:])
        args = args[:i]
    for ex in args or EXERCISES:
        run(ex, only)
