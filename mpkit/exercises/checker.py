"""``check(name, fn)``: run a learner's mechanism over every case of its exercise and say what is wrong.

Each case runs in a world of its own (``harness.run``): a crash costs that case, a deadlock or an
endless loop ends after ``timeout`` seconds with what each rank was waiting on, and the cases after a
deadlock are not run, so a check never takes much longer than one timeout. A stub left as it is
(it raises ``NotImplementedError``) is "not done yet", not an error.
"""
from __future__ import annotations

import time

from mpkit.errors import LaunchError
from mpkit.exercises import harness
from mpkit.exercises.catalog import get
from mpkit.exercises.common import failed
from mpkit.exercises.progress import record_check
from mpkit.exercises.result import CheckResult, Text
from mpkit.i18n import check_lang

STUCK_HINT = Text("모든 랭크가 서로를 기다립니다(교착). 블로킹 send는 상대가 recv를 걸 때까지 끝나지 않습니다: 짝이 맞는지, "
                  "양쪽이 먼저 보내기만 하지 않는지 보세요. isend/irecv를 둘 다 건 뒤에 wait()하면 풀립니다.",
                  "every rank waits for another (a deadlock). A blocking send does not finish until the peer posts its "
                  "recv: check that every send has its recv, and that two ranks do not both send first. Posting "
                  "isend and irecv and only then wait()ing on both avoids it.")
MISSING_HINT = Text("어떤 랭크는 코드를 끝냈는데 다른 랭크가 아직 그 랭크의 메시지를 기다립니다: send나 recv 하나가 빠졌습니다"
                    "(모든 send에는 짝이 되는 recv가 있어야 합니다).",
                    "some ranks returned from your code while others still wait on a message from them: a send or a "
                    "recv is missing (every send needs its matching recv).")
LOOP_HINT = Text("어떤 랭크는 통신을 기다리지 않고 계속 실행 중이었습니다: 끝나지 않는 반복문이 있는지 보세요.",
                 "some rank was still running, not waiting on a message: look for a loop that never ends.")


MISMATCH_HINT = Text("gloo는 랭크들이 한 집합 통신에 서로 다른 크기의 텐서를 넘기거나 집합 통신을 다른 순서로 부르면 프로세스를 멈춥니다: "
                     "모든 랭크가 같은 집합 통신을 같은 순서, 같은 모양으로 부르는지 보세요.",
                     "gloo aborts a process when ranks pass tensors of different sizes to one collective or call "
                     "collectives in a different order: check that every rank makes the same collectives, in the same "
                     "order, with the same shapes.")
# another rank died first (often gloo aborting a mismatched collective): this rank only saw its peer vanish
PEER_GONE = tuple((text, MISMATCH_HINT) for text in ("Connection reset by peer", "Connection closed by peer"))


def _rank_failure(case, err: LaunchError):
    """A rank that died (gloo aborts a process whose collective does not match its peers'), or
    mpkit's side of the case that could not use what the learner's code returned."""
    if err.exc_type == "died":
        return failed(case, Text(f"{err.summary}.", f"{err.summary}."), MISMATCH_HINT)
    return failed(case, Text(f"검사기가 결과를 쓸 수 없었습니다: {err.summary}",
                             f"the checker could not use what your code returned: {err.summary}"),
                  Text("연습의 설명대로 값을 돌려주었는지(무엇을, 어느 랭크에서) 확인하세요.",
                       "check that your code returns what the exercise says (what, and on which ranks)."))


def _stuck_hint(stuck: harness.Stuck) -> Text:
    if stuck.ranks(harness.RUNNING):
        return LOOP_HINT
    return MISSING_HINT if stuck.ranks(harness.RETURNED) else STUCK_HINT


def _not_done(crash: harness.LearnerCrashed) -> bool:
    return "NotImplementedError" in crash.text.strip().splitlines()[-1]


def check(name: str, fn, lang: str = "ko", timeout: float = 6.0, record: bool = True, student=None,
          results_dir=None) -> CheckResult:
    """Run ``fn`` (the learner's function, class or pair, as the exercise says) through every case of
    exercise ``name``; returns a :class:`CheckResult` (``.passed``, ``.message`` in ``lang``).

    ``record=True`` adds the outcome to the learner's results file (the quizzes' store), unless the
    stub was left untouched."""
    lang = check_lang(lang)
    exercise = get(name)
    if fn is None:
        raise TypeError(f"check({name!r}, fn): pass the {exercise.uses} you wrote, e.g. check({name!r}, {name})")
    results, stuck_in = [], None
    for case in exercise.cases:
        if stuck_in is not None:
            results.append(failed(case, Text(f"실행하지 않았습니다: '{stuck_in.name('ko')}'에서 멈췄습니다.",
                                             f"not run: '{stuck_in.name('en')}' did not finish.")))
            continue
        started = time.monotonic()
        try:
            results.append(exercise.judge(case, fn, timeout))
        except harness.UsedReference as used:
            results.append(failed(case, used.detail))
        except harness.LearnerCrashed as crash:
            if _not_done(crash):
                return CheckResult(name, lang, [], not_done=True)
            hint = next((h for text, h in (*exercise.crash_hints, *PEER_GONE) if text in crash.text), None)
            who = Text("여러분의 코드에서", "your code") if crash.world_size == 1 else \
                Text(f"랭크 {crash.rank}에서", f"rank {crash.rank}")
            results.append(failed(case, who + Text(f"예외가 났습니다:\n{crash.text}", f"raised:\n{crash.text}"), hint))
        except LaunchError as err:
            results.append(_rank_failure(case, err))
        except harness.Stuck as stuck:
            stuck_in = case
            waited = time.monotonic() - started
            results.append(failed(case, Text(f"{waited:.0f}초 안에 끝나지 않았습니다.", f"did not finish within {waited:.0f} s.")
                                  + stuck.text(),
                                  _stuck_hint(stuck)))
    result = CheckResult(name, lang, results)
    if record:
        record_check(result, student=student, results_dir=results_dir)
    return result
