"""Your own trainer: ``mpkit.train("3d", ..., use={piece: your function})`` trains the built-in gpt with
the pieces a learner wrote in the exercises in place of mpkit's (lab 13).

    use={"gradient_sync": average_gradients,                                # lab 01, on the dp x cp group
         # or "bucketed_gradient_sync": BucketedGradientSync                 # lab 01, without a pipeline
         "f_and_g": (CopyToParallelRegion, ReduceFromParallelRegion),       # lab 03, on the tp group
         "megatron_mlp": megatron_mlp,                                      # lab 03, on the tp group
         "pipeline_schedule": one_f_one_b_schedule,                         # lab 04, on the pp group
         "zero1_step": zero1_step}                                          # lab 06, dp x cp, with zero=True

Each piece must have passed its exercise's check: ``train`` runs ``mpkit.exercises.check`` on it in the
caller, before any rank starts, and refuses one that fails with the check's own message (a check is
remembered by the piece's source, so running a notebook again is cheap). How the pieces reach the
mesh's groups unchanged: ``mpkit.parallel.learner_pieces``. ``ready_pieces`` keeps the pieces that pass
and says which are missing, so a notebook with untouched stubs still trains (with mpkit's own).
"""
from __future__ import annotations

import inspect

from mpkit import training
from mpkit.exercises import check
from mpkit.i18n import check_lang
from mpkit.parallel.learner_pieces import PIECES, Pieces

NOT_PIECES = {"ring_attention": "ring_attention_merge computes the forward only (its output and log-sum-exp); training "
                                "needs the backward too, so mpkit's ring attention (attention='ring', cp >= 2) stays"}
_checked = {}  # (exercise, source) -> CheckResult: a notebook run again checks nothing twice


def _functions(part) -> list:
    """A function, or a class's methods: what ``inspect`` finds the source of also in a notebook cell
    (a class defined there has no file to read it from)."""
    if not isinstance(part, type):
        return [part]
    return [getattr(m, "__func__", m) for m in vars(part).values() if inspect.isfunction(getattr(m, "__func__", m))]


def _source(piece) -> str | None:
    parts = piece if isinstance(piece, tuple) else (piece,)
    try:
        return "\n".join(inspect.getsource(f) for part in parts for f in _functions(part))
    except (OSError, TypeError):  # no source to read (built in a string): check it every time
        return None


def check_piece(name: str, piece, lang: str = "ko"):
    """The check of the exercise behind piece ``name`` on ``piece`` (``CheckResult``), remembered by its source."""
    exercise = PIECES[name][0]
    key = (exercise, _source(piece), lang)
    if key[1] is None or key not in _checked:
        _checked[key] = check(exercise, piece, lang=lang, record=False)
    return _checked[key]


def _unknown(name) -> str:
    why = f" ({NOT_PIECES[name]})" if name in NOT_PIECES else ""
    return f"use={{{name!r}: ...}} is no piece{why}; the pieces are: {', '.join(PIECES)}"


def pieces_of(use: dict, lang: str = "ko") -> Pieces:
    """``use`` checked: known names, and every piece passed its exercise (else a ValueError with the check's message)."""
    if not isinstance(use, dict):
        raise TypeError(f"use={use!r} must be a dict {{piece name: your function}}; the pieces are: {', '.join(PIECES)}")
    for name in use:
        if name not in PIECES:
            raise ValueError(_unknown(name))
    for name, piece in use.items():
        result = check_piece(name, piece, lang)
        if not result.passed:
            head = (f"use={{{name!r}: ...}}: 연습 {PIECES[name][0]!r}의 검사를 아직 통과하지 못했습니다" if lang == "ko" else
                    f"use={{{name!r}: ...}} has not passed its exercise {PIECES[name][0]!r}")
            raise ValueError(f"{head}:\n{result.message}")
    return Pieces(**use)


def train(strategy="single", world_size=None, *, use=None, lang="ko", **kwargs):
    """``mpkit.train`` (``mpkit.training.train``, whose docstring follows); with ``use`` (strategy "3d")
    the learner's checked pieces replace mpkit's (``lang``: the language of a failed check's message)."""
    if use is None:
        return training.train(strategy, world_size, **kwargs)
    lang = check_lang(lang)
    if strategy != "3d":
        raise ValueError(f"use= puts your pieces on the 3d strategy's mesh; pass strategy='3d' (got {strategy!r}), "
                         f"e.g. mpkit.train('3d', world_size=4, dp=2, tp=2, use=...)")
    taken = [k for k in ("checkpoint_dir", "resume_from") if kwargs.get(k) is not None]
    if taken:
        raise ValueError(f"use= does not take {' or '.join(taken)}: your ZeRO-1 step keeps its own optimizer state")
    pieces = pieces_of(use, lang)
    kwargs.setdefault("backend", "gloo")  # where the checks ran them: CPU tensors, as exercise code makes them
    return training.train(strategy, world_size, use=pieces if pieces.names() else None, **kwargs)


train.__doc__ = inspect.cleandoc(train.__doc__) + "\n\n" + inspect.cleandoc(training.train.__doc__)


def ready_pieces(candidates: dict, lang: str = "ko") -> dict:
    """The pieces of ``candidates`` that pass their checks; says, per piece, ready or what is missing
    (a stub left as it is: mpkit's own piece runs in its place)."""
    lang = check_lang(lang)
    ready = {}
    for name, piece in candidates.items():
        if name not in PIECES:
            raise ValueError(_unknown(name))
        result = check_piece(name, piece, lang)
        if result.passed:
            ready[name] = piece
            print(f"✔ {name}: " + ("준비됐습니다 — 여러분의 코드가 돌아갑니다." if lang == "ko" else "ready — your code runs."))
        elif result.not_done:
            print(f"· {name}: " + ("아직 풀지 않았습니다 — mpkit의 것이 대신 돌아갑니다." if lang == "ko" else
                                   "not done yet — mpkit's own runs in its place."))
        else:
            print(f"✘ {name}: " + ("검사를 통과하지 못했습니다 — mpkit의 것이 대신 돌아갑니다." if lang == "ko" else
                                   "did not pass its check — mpkit's own runs in its place.") + f"\n{result.message}")
    return ready


__all__ = ["train", "ready_pieces", "check_piece", "PIECES"]
