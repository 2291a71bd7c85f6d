"""``check(name, fn)``: run a learner's mechanism over every case of its exercise and say what is wrong.

Each case runs in a world of its own (``harness.run``): a crash costs that case, a deadlock or an
endless loop ends after ``timeout`` seconds with what each rank was waiting on, and the cases after a
deadlock are not run, so a check never takes much longer than one timeout. A stub left as it is
(it raises ``NotImplementedError``) is "not done yet", not an error.
"""
from __future__ import annotations

import inspect
import re
import time

import torch
import torch.distributed as dist

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
LOOP_HINT = Text("어떤 랭크는 검사기가 본 통신을 기다리지 않고 계속 실행 중이었습니다: 끝나지 않는 반복문이 있거나, 없는 랭크와 "
                 "통신하려 합니다(랭크는 0..N-1: 이웃은 % N으로 감싸고, 그래디언트는 r-1 쪽으로 거꾸로 갑니다).",
                 "some rank was still running, not waiting on a message the checker saw: a loop that never ends, or a "
                 "message to a rank that does not exist (ranks are 0..N-1: wrap neighbours with % N; gradients go "
                 "backwards, to r-1).")


NOT_DONE = Text("아직 풀지 않았습니다: 함수를 채운 뒤 다시 확인하세요.", "not done yet: fill in the function, then check again.")
MISMATCH_HINT = Text("gloo는 랭크들이 한 집합 통신에 서로 다른 크기의 텐서를 넘기거나 집합 통신을 다른 순서로 부르면 프로세스를 멈춥니다: "
                     "모든 랭크가 같은 집합 통신을 같은 순서, 같은 모양으로 부르는지 보세요.",
                     "gloo aborts a process when ranks pass tensors of different sizes to one collective or call "
                     "collectives in a different order: check that every rank makes the same collectives, in the same "
                     "order, with the same shapes.")
# another rank died first (often gloo aborting a mismatched collective): this rank only saw its peer vanish
PEER_GONE = tuple((text, MISMATCH_HINT) for text in ("Connection reset by peer", "Connection closed by peer"))


# Likely causes of an exception no exercise hint recognised, by a phrase of its last line (checked in order).
CAUSES = (
    (("must match the size", "size mismatch", "shapes cannot be multiplied", "The size of tensor", "shape '[",
      "Sizes of tensors must match", "expected input with shape", "does not match the broadcast shape",
      "same number of elements", "output tensor size must be equal"),
     Text("모양(shape)이 맞지 않는 텐서를 함께 썼습니다: 오류 위의 줄에서 각 텐서의 .shape을 출력해 보고, 청크나 샤드를 나눈 크기"
          "(world_size로 나누어떨어지지 않을 때 포함)와 집합 통신의 입력·출력 크기를 확인하세요.",
          "tensors of shapes that do not fit were combined: print each tensor's .shape on the line above the error, and "
          "check how you cut chunks or shards (also when the size does not divide by the world size) and a collective's "
          "input and output sizes.")),
    (("dtype", "expected scalar type", "Expected object of scalar type", "result type"),
     Text("자료형(dtype)이 다릅니다: 새로 만든 버퍼는 torch.empty_like/zeros_like처럼 원래 텐서의 dtype을 따르게 하세요"
          "(정수 인덱스나 float64로 만든 텐서가 섞였는지 보세요).",
          "the dtypes differ: make new buffers follow the original tensor (torch.empty_like, zeros_like), and look for a "
          "tensor made as integers or float64.")),
    (("process group", "not part of", "group=", "Invalid group", "global rank", "group rank"),
     Text("프로세스 그룹 문제입니다: 그룹에 속한 랭크만 그 그룹으로 통신하고, 그룹 안의 랭크 번호와 전체 랭크 번호를 "
          "섞지 마세요(dist.get_global_rank로 바꿉니다).",
          "a process-group problem: only the ranks in a group may communicate on it, and a rank's number inside the "
          "group is not its global one (dist.get_global_rank converts).")),
    (("negative dimension",),
     Text("크기가 음수가 되었습니다: 범위의 끝이 시작보다 앞입니다. 범위의 경계(예: 가운데 mid = (lo + hi) // 2)를 그 범위 자신의 "
          "양 끝에서 구했는지 보세요(범위 안의 길이가 아니라 위치로).",
          "a size came out negative: a range ends before it starts. Check how you compute a range's bounds (e.g. its "
          "middle, mid = (lo + hi) // 2) from that range's own ends (a position, not a length inside the range).")),
    (("IndexError", "out of range", "out of bounds", "Invalid rank", "invalid rank"),
     Text("인덱스가 범위를 벗어났습니다: 랭크 번호는 0..world_size-1이니 이웃은 (rank ± 1) % world_size로, 청크 번호도 "
          "% 청크 개수로 감싸세요.",
          "an index is out of range: ranks are 0..world_size-1, so take neighbours as (rank ± 1) % world_size and wrap "
          "chunk numbers modulo the number of chunks.")),
    (("positional argument", "unexpected keyword argument", "required positional", "takes no arguments"),
     Text("함수를 받는 인수와 다른 인수로 불렀습니다: 오류 줄에서 부른 함수의 시그니처(인수 순서와 이름)를 확인하세요.",
          "a function was called with arguments it does not take: check the signature (order and names) of the call "
          "on the line of the error.")),
    (("Boolean value of Tensor",),
     Text("텐서가 True/False 자리에 왔습니다: 인수의 순서가 바뀌었거나(예: 텐서를 op, group, async_op 자리에), if에 텐서를 "
          "썼습니다.", "a tensor stood where a True/False was expected: arguments in the wrong order (a tensor passed as "
          "op, group or async_op), or a tensor used in an if.")),
    (("NoneType", "None"),
     Text("어떤 값이 None입니다: 역전파가 닿지 않은 텐서의 .grad(고정된 파라미터, requires_grad가 꺼진 입력)나, 값을 돌려주지 "
          "않은 함수(return 빠짐)를 확인하세요.",
          "something is None: the .grad of a tensor the backward never reached (a frozen parameter, an input without "
          "requires_grad), or a function that returns nothing (a missing return).")),
)
UNKNOWN_CAUSE = Text("코드에서 예외가 났습니다: 위 트레이스백의 마지막 줄이 원인이고, 그 위의 줄이 작성한 코드에서 그것이 난 곳입니다.",
                     "your code raised: the last line of the traceback above is the cause, the line above it the place in "
                     "your code where it happened.")


def crash_hint(exercise, text: str) -> Text:
    """The hint for an exception: the exercise's own (a classic mistake), a peer that died, else its
    likely cause read from the error's last line (shape, dtype, group, rank index, signature, None)."""
    hint = next((h for phrase, h in (*exercise.crash_hints, *PEER_GONE) if phrase in text), None)
    if hint is not None:
        return hint
    last = text.strip().splitlines()[-1] if text.strip() else ""
    return next((h for phrases, h in CAUSES if any(phrase in last for phrase in phrases)), UNKNOWN_CAUSE)


def _rank_failure(case, err: LaunchError):
    """A rank that died (gloo aborts a process whose collective does not match its peers'), or
    mpkit's side of the case that could not use what the learner's code returned."""
    if err.exc_type == "died":
        return failed(case, Text(f"{err.summary}.", f"{err.summary}."), MISMATCH_HINT)
    return failed(case, Text(f"검사기가 결과를 쓸 수 없었습니다: {err.summary}",
                             f"the checker could not use what your code returned: {err.summary}"),
                  Text("연습의 설명대로 값을 돌려주었는지(무엇을, 어느 랭크에서) 확인하세요.",
                       "check that your code returns what the exercise says (what, and on which ranks)."))


COLLECTIVE_KINDS = set(harness.KINDS.values()) - {"send", "recv"}


def _collective_hint(stuck: harness.Stuck) -> Text | None:
    """Ranks stuck in a collective: a collective is only done when every rank of the group calls it,
    so the others either never call it (an ``if`` around it) or wait in another call."""
    inside = {r: what.split(" ")[0] for r, what in stuck.waits.items()
              if "waiting" in what and what.split(" ")[0] in COLLECTIVE_KINDS}
    if not inside:
        return None
    name = sorted(set(inside.values()))[0]
    waiting = sorted(r for r, kind in inside.items() if kind == name)
    others = sorted(r for r in stuck.waits if r not in waiting)
    if not others:
        return Text(f"모든 랭크가 {name}에서 기다립니다: 랭크마다 집합 통신을 부르는 횟수나 순서가 다릅니다(예: 반복 횟수가 랭크에 "
                    "따라 다름). 모든 랭크가 같은 집합 통신을 같은 순서로 같은 횟수만큼 부르게 하세요.",
                    f"every rank waits in {name}: the ranks call collectives a different number of times or in a "
                    "different order (e.g. a loop whose count depends on the rank). Make every rank make the same "
                    "collectives, in the same order, as many times.")
    return Text(f"랭크 {waiting}이(가) 집합 통신 {name}에서 기다리는데 랭크 {others}은(는) 그것을 부르지 않았거나 다른 곳에서 "
                "기다립니다: 집합 통신은 "
                "그룹의 모든 랭크가 같은 순서로 불러야 끝납니다. 일부 랭크만 부르게 하는 if(예: if rank == 0:) 안에 두지 "
                "마세요(send/recv의 짝 문제가 아닙니다).",
                f"ranks {waiting} wait in the collective {name}, which ranks {others} never called (or they wait elsewhere): "
                "a collective finishes "
                "only when every rank of the group calls it, in the same order. Do not put it under an if that only "
                "some ranks take (e.g. if rank == 0:); this is not a send/recv pairing problem.")


def _no_such_rank(stuck: harness.Stuck) -> Text | None:
    """A rank waiting on a message to or from a rank outside 0..N-1 (the direction got reversed)."""
    n = len(stuck.waits)
    for rank, what in sorted(stuck.waits.items()):
        found = re.search(r"(send to|recv from) rank (-?\d+)", what)
        if found and not 0 <= int(found.group(2)) < n:
            peer = int(found.group(2))
            return Text(f"랭크 {rank}이(가) 없는 랭크 {peer}와 통신하려 합니다(랭크는 0..{n - 1}): 방향을 확인하세요. 활성값은 "
                        "r+1로, 그래디언트는 거꾸로 r-1(이전 랭크)로 갑니다. 첫 랭크와 마지막 랭크는 한쪽 이웃이 없습니다.",
                        f"rank {rank} messages rank {peer}, which does not exist (ranks are 0..{n - 1}): check the "
                        "direction. Activations go to r+1, gradients backwards to r-1 (the previous rank); the first "
                        "and the last rank have a neighbour on one side only.")
    return None


def _stuck_hint(stuck: harness.Stuck) -> Text:
    missing = _no_such_rank(stuck)
    if missing is not None:
        return missing
    collective = _collective_hint(stuck)
    if collective is not None:
        return collective
    if stuck.ranks(harness.RUNNING):
        return LOOP_HINT
    return MISSING_HINT if stuck.ranks(harness.RETURNED) else STUCK_HINT


def _stub_object(exercise):
    """What the stub defines under the exercise's name (its function or class), or None."""
    namespace = {"torch": torch, "dist": dist}
    try:
        exec(compile(exercise.stub, f"<{exercise.name} stub>", "exec"), namespace)
    except Exception:  # a stub that needs more than torch to define itself is not compared
        return None
    return namespace.get(exercise.target)


def _accepts(sig: inspect.Signature, wanted: inspect.Signature) -> bool:
    """Can a callable of ``sig`` take the call the exercise makes (``wanted``'s parameters without a
    default positionally, those with one by name), with no stub parameter name in another place
    (``(tensor, group)`` where the stub has ``(ctx, tensor)``)? Other names are the learner's choice."""
    required = [q for q in wanted.parameters.values() if q.default is inspect.Parameter.empty]
    optional = {q.name: q.default for q in wanted.parameters.values() if q.default is not inspect.Parameter.empty}
    try:
        sig.bind(*range(len(required)), **optional)
    except TypeError:
        return False
    theirs = [q.name for q in sig.parameters.values() if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
    return all(theirs.index(q.name) == i for i, q in enumerate(required) if q.name in theirs)


def _signature_problem(exercise, fn) -> Text | None:
    """The learner's function or class does not take what the exercise passes: say so before running
    anything (otherwise the first sign is a torch error from deep inside, far from the cause)."""
    stub = _stub_object(exercise)
    if stub is None or isinstance(fn, tuple) or not callable(fn):
        return None
    try:
        wanted, theirs = inspect.signature(stub), inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function: nothing to compare
        return None
    if _accepts(theirs, wanted):
        return None
    call = f"{exercise.target}{wanted}"
    return Text(f"연습은 {call}로 부르는데, 작성한 {getattr(fn, '__name__', exercise.target)}은(는) {theirs}을(를) 받습니다: "
                "매개변수를 스텁과 같은 순서, 같은 이름으로 맞추세요.",
                f"the exercise calls {call}; yours, {getattr(fn, '__name__', exercise.target)}, takes {theirs}: "
                "give it the stub's parameters, in the stub's order and with its names.")


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
    wrong_signature = _signature_problem(exercise, fn)
    if wrong_signature is not None:
        skipped = Text("실행하지 않았습니다(시그니처가 다름).", "not run (the signature differs).")
        result = CheckResult(name, lang, [failed(case, wrong_signature if i == 0 else skipped)
                                          for i, case in enumerate(exercise.cases)])
        if record:
            record_check(result, student=student, results_dir=results_dir)
        return result
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
            if _not_done(crash):  # every case fails as "not done" (a grader's cell asks for its case: 0 points, no IndexError)
                return CheckResult(name, lang, [failed(c, NOT_DONE) for c in exercise.cases], not_done=True)
            who = Text("여러분의 코드에서", "your code") if crash.world_size == 1 else \
                Text(f"랭크 {crash.rank}에서", f"rank {crash.rank}")
            results.append(failed(case, who + Text(f"예외가 났습니다:\n{crash.text}", f"raised:\n{crash.text}"),
                                  crash_hint(exercise, crash.text)))
        except LaunchError as err:
            results.append(_rank_failure(case, err))
        except harness.Stuck as stuck:
            stuck_in = case
            waited = time.monotonic() - started
            ended = (Text(f"{waited:.0f}초 안에 끝나지 않았습니다.", f"did not finish within {waited:.0f} s.")
                     if waited >= timeout else  # a loop, or a wait nothing was seen to block; else a deadlock, ended early
                     Text(f"{waited:.1f}초 뒤에 멈췄습니다: 어느 랭크도 더 나아갈 수 없었습니다.",
                          f"stopped after {waited:.1f} s: no rank could go on."))
            results.append(failed(case, ended + stuck.text(),
                                  _stuck_hint(stuck)))
    result = CheckResult(name, lang, results)
    if record:
        record_check(result, student=student, results_dir=results_dir)
    return result
