"""``check(name, fn)``: run a learner's mechanism over every case of its exercise and say what is wrong.

Each case runs in a world of its own (``harness.run``): a crash costs that case, a deadlock or an
endless loop ends after ``timeout`` seconds with what each rank was waiting on, and the cases after a
deadlock are not run, so a check never takes much longer than one timeout. A stub left as it is
(it raises ``NotImplementedError``) is "not done yet", not an error.
"""
from __future__ import annotations

import time

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
LOOP_HINT = Text("어떤 랭크는 통신을 기다리지 않고 계속 실행 중이었습니다: 끝나지 않는 반복문이 있는지 보세요.",
                 "some rank was still running, not waiting on a message: look for a loop that never ends.")


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
        except harness.LearnerCrashed as crash:
            if _not_done(crash):
                return CheckResult(name, lang, [], not_done=True)
            hint = next((h for text, h in exercise.crash_hints if text in crash.text), None)
            results.append(failed(case, Text(f"랭크 {crash.rank}에서 예외가 났습니다:\n{crash.text}",
                                             f"rank {crash.rank} raised:\n{crash.text}"), hint))
        except harness.Stuck as stuck:
            stuck_in = case
            waited = time.monotonic() - started
            results.append(failed(case, Text(f"{waited:.0f}초 안에 끝나지 않았습니다. {stuck.describe()}",
                                             f"did not finish within {waited:.0f} s. {stuck.describe()}"),
                                  STUCK_HINT if stuck.all_waiting else LOOP_HINT))
    result = CheckResult(name, lang, results)
    if record:
        record_check(result, student=student, results_dir=results_dir)
    return result
