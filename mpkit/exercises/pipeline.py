"""Lab 04 exercises: the GPipe and 1F1B schedules as instruction lists (schedules as data).

The learner writes ``schedule(rank, p, m)`` -> rank's list of mpkit's pipeline instructions. The
checker takes every rank's list and (1) checks each micro-batch is computed once forward and once
backward, (2) plays the lists on the simulator (a deadlock or mismatched messages is named there,
with where each rank waits), (3) checks the schedule's defining property — GPipe: every forward
before any backward; 1F1B: rank r never holds more than p - r micro-batches' activations and the
unit-cost bubble is 1F1B's (p-1)/(m+p-1), so running F_k B_k with no overlap fails — and
(4) runs the lists for real with mpkit's executor: every stage's gradients must equal the
unsplit model's. Any valid order passes: nothing is compared with the reference's list.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mpkit.exercises import harness
from mpkit.exercises.common import Case, Exercise, compare_grads, failed, grads, passed, seeded
from mpkit.exercises.result import Text
from mpkit.parallel.pipeline.executor import PipelineExecutor
from mpkit.parallel.pipeline.schedules import (Backward, BackwardInput, BackwardWeight, Forward, OptimizerStep, RecvAct,
                                               RecvGrad, ScheduleError, SendAct, SendGrad, simulate)

KINDS = (Forward, Backward, BackwardInput, BackwardWeight, SendAct, RecvAct, SendGrad, RecvGrad, OptimizerStep)
WHOLE = (Forward, Backward)  # the computations of a schedule whose backward is not split
WIDTH, ROWS_PER_MB = 6, 2


def _lists_body(ctx, recorder, fn, p, m):
    return [recorder.call(fn, rank, p, m) for rank in range(p)]


def _model(seed, stages):
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
                                 for _ in range(stages)])


def _data(seed, m):
    g = seeded(seed)
    return torch.randn(m * ROWS_PER_MB, WIDTH, generator=g), torch.randn(m * ROWS_PER_MB, WIDTH, generator=g)


def _stage_grads(model, stages) -> dict:
    """The gradients of ``stages`` of ``model``, named "stage s: parameter"."""
    return {f"stage {s}: {name}": grad for s in stages for name, grad in grads(model[s]).items()}


def _run_body(ctx, recorder, programs, seed, where):
    p, m = ctx.world_size, len({i.mb for i in programs[0] if isinstance(i, Forward)})
    model, mine = _model(seed, len(where)), [s for s, r in enumerate(where) if r == ctx.rank]
    x, y = _data(seed, m)
    executor = PipelineExecutor({s: model[s] for s in mine}, len(where), m, F.mse_loss, list(range(p)), where=where)
    executor.step(programs[ctx.rank], x if 0 in mine else None, y if len(where) - 1 in mine else None)
    return _stage_grads(model, mine)


NEIGHBOURS = Text("활성값은 r → r+1(SendAct to=r+1, RecvAct frm=r-1), 그래디언트는 r+1 → r(RecvGrad frm=r+1, SendGrad to=r-1). "
                  "첫 스테이지는 활성값을 받지 않고 마지막 스테이지는 보내지 않습니다.",
                  "activations go r -> r+1 (SendAct to=r+1, RecvAct frm=r-1), gradients r+1 -> r (RecvGrad frm=r+1, "
                  "SendGrad to=r-1). The first stage receives no activation and the last sends none.")
NEIGHBOURS_OF_STAGES = Text("활성값은 스테이지 s → s+1로, 그래디언트는 s+1 → s로 갑니다. 스테이지 s는 랭크 s % p에 있습니다: "
                            "SendAct(mb, s, to=(s+1) % p), RecvAct(mb, s, frm=(s-1) % p), RecvGrad(mb, s, frm=(s+1) % p), "
                            "SendGrad(mb, s, to=(s-1) % p). 첫 스테이지는 활성값을 받지 않고 마지막 스테이지는 보내지 않습니다.",
                            "activations go from stage s to s+1, gradients from s+1 to s, and stage s lives on rank s % p: "
                            "SendAct(mb, s, to=(s+1) % p), RecvAct(mb, s, frm=(s-1) % p), RecvGrad(mb, s, frm=(s+1) % p), "
                            "SendGrad(mb, s, to=(s-1) % p). The first stage receives no activation and the last sends none.")


def _computations(case, where, program, mine, m, kinds):
    """Each computation kind of ``kinds`` exactly once per micro-batch on each stage of ``mine``,
    and no other computation."""
    for ins in program:
        if isinstance(ins, (Forward, Backward, BackwardInput, BackwardWeight)) and not isinstance(ins, kinds):
            wanted = ", ".join(k.__name__ for k in kinds)
            return failed(case, where + Text(f"{ins}: 이 연습의 계산은 {wanted}입니다.",
                                             f"{ins}: this exercise's computations are {wanted}."),
                          Text("B/W로 나눈 스케줄은 Backward 대신 BackwardInput(B)과 BackwardWeight(W)를, 나누지 않은 스케줄은 "
                               "Backward만 씁니다.", "a schedule with the backward split uses BackwardInput (B) and "
                               "BackwardWeight (W) instead of Backward; an unsplit one uses Backward only."))
    for kind in kinds:
        for stage in mine:
            done = sorted(i.mb for i in program if isinstance(i, kind) and i.stage == stage)
            if done != list(range(m)):
                held = (Text(f"(스테이지 s는 랭크 s % p에 있습니다: 이 랭크는 스테이지 {mine}을(를) 가집니다)",
                             f"(stage s lives on rank s % p: this rank holds stages {mine})") if len(mine) > 1
                        else Text("", ""))
                return failed(case, where + Text(f"{kind.__name__}(mb, stage={stage})가 마이크로배치 0..{m - 1}마다 정확히 한 번씩 "
                                                 f"있어야 하는데 {done}입니다.",
                                                 f"needs {kind.__name__}(mb, stage={stage}) exactly once for each "
                                                 f"micro-batch 0..{m - 1}; it has {done}.") + held)
        stray = next((i for i in program if isinstance(i, kind) and i.stage not in mine), None)
        if stray is not None:
            return failed(case, where + Text(f"{stray}: 이 랭크에는 스테이지 {stray.stage}가 없습니다(스테이지 {mine}).",
                                             f"{stray}: this rank does not hold stage {stray.stage} (it holds {mine})."))
    return None


def _structure(case, programs, p, m, where=None, kinds=WHOLE):
    """Each rank's list: instructions only; every computation of ``kinds`` once per micro-batch and
    stage it holds (``where[s]``: the rank of stage s; default stage = rank); messages only between
    neighbouring stages; OptimizerStep last."""
    where = where or list(range(p))
    last = len(where) - 1
    for rank, program in enumerate(programs):
        at = Text(f"랭크 {rank}의 목록:", f"rank {rank}'s list:")
        if program is None:
            return failed(case, at + Text("None입니다: 함수가 목록을 돌려주지 않았습니다(return이 빠졌나요?).",
                                          "None: the function returned no list (a missing return?)."))
        if not isinstance(program, list) or not all(isinstance(i, KINDS) for i in program):
            return failed(case, at + Text("명령(Forward, Backward, SendAct, ...)의 list여야 합니다.",
                                          "must be a list of instructions (Forward, Backward, SendAct, ...)."))
        mine = [s for s, r in enumerate(where) if r == rank]
        problem = _computations(case, at, program, mine, m, kinds)
        if problem:
            return problem
        for ins in program:
            peer = getattr(ins, "to", getattr(ins, "frm", None))
            if peer is None:
                continue
            neighbour = ins.stage + 1 if isinstance(ins, (SendAct, RecvGrad)) else ins.stage - 1
            if ins.stage in mine and 0 <= neighbour <= last and peer == where[neighbour]:
                continue
            what = (Text(f"{ins}: 이 랭크에는 스테이지 {ins.stage}가 없습니다.", f"{ins}: this rank does not hold stage {ins.stage}.")
                    if ins.stage not in mine else
                    Text(f"{ins}: 스테이지 {ins.stage}는 {'마지막' if neighbour > last else '첫'} 스테이지라 그쪽에 이웃 스테이지"
                         f"({neighbour})가 없습니다: 이 메시지는 빼세요.",
                         f"{ins}: stage {ins.stage} is the {'last' if neighbour > last else 'first'} stage, with no "
                         f"neighbouring stage on that side (no stage {neighbour}): leave this message out.")
                    if not 0 <= neighbour <= last else
                    Text(f"{ins}: 스테이지 {ins.stage}의 이 메시지는 랭크 {where[neighbour]}와 주고받아야 합니다.",
                         f"{ins}: this message of stage {ins.stage} goes to or comes from rank {where[neighbour]}."))
            return failed(case, at + what, NEIGHBOURS if where == list(range(p)) else NEIGHBOURS_OF_STAGES)
        if not program or not isinstance(program[-1], OptimizerStep):
            return failed(case, at + Text("마지막 명령은 OptimizerStep()이어야 합니다.",
                                          "must end with OptimizerStep()."))
    return None


SIMULATOR_HINTS = (
    ("does not hold", Text("보내는 명령이 그 값을 만드는 계산보다 먼저 옵니다: SendAct는 Forward 뒤, SendGrad는 Backward 뒤에.",
                           "a send comes before the computation that produces what it sends: SendAct after its Forward, "
                           "SendGrad after its Backward.")),
    ("runs without", Text("명령이 필요한 입력 없이 실행됩니다: Backward는 같은 마이크로배치의 Forward 뒤에, Forward/Backward는 그 앞의 "
                          "RecvAct/RecvGrad 뒤에 와야 합니다.", "an instruction runs without its input: a Backward must come "
                          "after its micro-batch's Forward, and a Forward/Backward after the RecvAct/RecvGrad before it.")),
    ("matched by", Text("받는 쪽은 보내는 쪽과 같은 순서로 메시지를 받아야 합니다(두 랭크 사이 메시지는 건 순서대로 짝지어짐).",
                        "a receiver must post its messages in the sender's order (messages between two ranks are matched "
                        "in the order they are posted).")),
    ("", Text("두 랭크가 서로에게서 받기만 기다리면 교착입니다: 활성값은 Forward 바로 앞에서 받고 바로 뒤에서 보내세요"
              "(그래디언트는 Backward 앞뒤).", "two ranks that each wait to receive from the other deadlock: receive an "
              "activation right before its Forward and send it right after (gradients: around the Backward).")),
)


def schedule_judge(prop, where_of=None, kinds=WHOLE, costs=None, describe=None, simulator_hint=None):
    """A judge for schedule exercises: the lists' structure (``where_of(p)``: each stage's rank,
    default stage = rank; ``kinds``: the computations), then the simulator on unit costs
    (``costs``: ``simulate``'s keyword arguments), then ``prop(case, programs, sim, p, m)`` (the
    schedule's own property or cost target: a failed CaseResult or None), then a real run whose
    gradients must equal the unsplit model's. A pass says ``describe(sim, p, m)`` (default: the
    bubble and the activations in flight); ``simulator_hint(programs, p, m)``: the exercise's own
    hint when the simulator cannot run the lists (None: the general ones)."""
    def judge(case, fn, timeout):
        p, m, seed = case.world_size, case.params["m"], case.params["seed"]
        where = where_of(p) if where_of else list(range(p))
        programs = harness.run(_lists_body, 1, (fn, p, m), timeout)[0]["out"]
        problem = _structure(case, programs, p, m, where, kinds)
        if problem:
            return problem
        try:
            sim = simulate(programs, **(costs or {}))
        except ScheduleError as err:
            return failed(case, Text(f"시뮬레이터에서 실행할 수 없습니다: {err}", f"the simulator cannot run the lists: {err}"),
                          (simulator_hint and simulator_hint(programs, p, m))
                          or next(h for key, h in SIMULATOR_HINTS if key in str(err)))
        problem = prop(case, programs, sim, p, m)
        if problem:
            return problem
        outputs = harness.run(_run_body, p, (programs, seed, where), timeout)
        model = _model(seed, len(where))
        x, y = _data(seed, m)
        F.mse_loss(model(x), y).backward()
        for rank, output in enumerate(outputs):
            mine = [s for s, r in enumerate(where) if r == rank]
            problem = compare_grads(case, rank, _stage_grads(model, mine), output["out"], p)
            if problem:
                return problem
        return passed(case, (describe or bubble_text)(sim, p, m))
    return judge


def bubble_text(sim, p=None, m=None) -> Text:
    return Text(f"버블 {float(sim.bubble):.1%}(단위 시간), 랭크별 최대 활성값 {sim.peak_in_flight}",
                f"bubble {float(sim.bubble):.1%} (unit times), activations in flight per rank at most {sim.peak_in_flight}")


def _gpipe_property(case, programs, sim, p, m):
    for rank, program in enumerate(programs):
        order = [i for i in program if isinstance(i, (Forward, Backward))]
        if next(k for k, i in enumerate(order) if isinstance(i, Backward)) < m:
            return failed(case, Text(f"랭크 {rank}: 모든 Forward 전에 Backward가 시작했습니다.",
                                     f"rank {rank}: a Backward starts before every Forward has run."),
                          Text("GPipe는 m개의 Forward를 모두 한 뒤에 Backward를 합니다(채우고, 비우기).",
                               "GPipe runs all m Forwards, then the Backwards (fill, then drain)."))
    return None


def _warmup_hint(programs, p, m):
    """When 1F1B's lists cannot run: the first rank whose warm-up is not min(p-r-1, m) Forwards."""
    for rank, program in enumerate(programs):
        order = [i for i in program if isinstance(i, (Forward, Backward))]
        warmup = next((k for k, i in enumerate(order) if isinstance(i, Backward)), len(order))
        if warmup - 1 != min(p - rank - 1, m) and not (warmup == m and p - rank - 1 >= m):
            return Text(f"랭크 {rank}이(가) 첫 Backward 전에 Forward를 {warmup}개 합니다: 1F1B의 준비 단계(warm-up)는 랭크 r마다 "
                        f"min(p-r-1, m)개(여기서는 {min(p - rank - 1, m)}개)이고, 그다음 Forward 하나를 더 한 뒤 Backward를 "
                        "시작합니다. 앞 스테이지일수록 많습니다.",
                        f"rank {rank} runs {warmup} Forwards before its first Backward: 1F1B's warm-up on rank r is "
                        f"min(p-r-1, m) Forwards (here {min(p - rank - 1, m)}), then one more Forward before the first "
                        "Backward; the earlier the stage, the longer its warm-up.")
    return None


def _one_f_one_b_property(case, programs, sim, p, m):
    for rank in range(p):
        limit = min(m, p - rank)
        if sim.peak_in_flight[rank] > limit:
            return failed(case, Text(f"랭크 {rank}이(가) 한때 {sim.peak_in_flight[rank]}개 마이크로배치의 활성값을 들고 있습니다"
                                     f"(1F1B는 최대 {limit}).", f"rank {rank} holds the activations of "
                                     f"{sim.peak_in_flight[rank]} micro-batches at once (1F1B: at most {limit})."),
                          Text("준비 단계(warm-up)에서 랭크 r은 p-r-1개만 Forward하고, 그다음부터 Forward 하나와 Backward 하나를 "
                               "번갈아 하세요.", "in the warm-up rank r runs only p-r-1 Forwards, then alternates one "
                               "Forward and one Backward."))
    target = (p - 1) / (m + p - 1)
    if float(sim.bubble) > target + 1e-9:
        short = [r for r in range(p) if sim.peak_in_flight[r] < min(m, p - r)]
        return failed(case, Text(f"값은 맞지만 버블이 {float(sim.bubble):.1%}입니다(단위 시간): 1F1B의 목표는 (p-1)/(m+p-1) = "
                                 f"{target:.1%}입니다.", f"the values are right but the bubble is {float(sim.bubble):.1%} "
                                 f"(unit times): 1F1B's target is (p-1)/(m+p-1) = {target:.1%}."),
                      Text(f"준비 단계(warm-up)가 짧아 파이프라인이 쉽니다(랭크 {short}): 랭크 r은 첫 Backward 전에 min(p-r-1, m)개를 "
                           "Forward해야 다음 스테이지가 계속 일합니다.", f"the warm-up is too short, so the pipeline idles "
                           f"(ranks {short}): rank r runs min(p-r-1, m) Forwards before its first Backward, which keeps the "
                           "next stages busy."))
    return None


STUB = '''def {name}(rank, p, m):
    """{doc_ko}
    {doc_en}
    명령 / instructions: Forward(mb, stage), Backward(mb, stage), RecvAct(mb, stage, frm), SendAct(mb, stage, to),
    RecvGrad(mb, stage, frm), SendGrad(mb, stage, to), OptimizerStep()  (from mpkit.parallel.pipeline.schedules).
    랭크 r은 스테이지 r을, 마이크로배치는 0..m-1입니다.
    Rank r holds stage r (stages 0..p-1); micro-batches are 0..m-1."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''
STUB_GPIPE = STUB.format(name="gpipe_schedule",
                         doc_ko="GPipe: 랭크의 명령 목록(list)을 돌려줍니다. 모든 마이크로배치를 Forward한 뒤 모두 Backward, 마지막에 OptimizerStep().",
                         doc_en="GPipe: return this rank's instruction list: every micro-batch forward, then every one backward, then OptimizerStep().")
STUB_1F1B = STUB.format(name="one_f_one_b_schedule",
                        doc_ko="1F1B: 준비 단계(warm-up) Forward 몇 개, 그다음 Forward 하나·Backward 하나를 번갈아, 끝에 남은 Backward, OptimizerStep(). 목표: 버블 (p-1)/(m+p-1), 랭크 r의 활성값 최대 p-r개.",
                        doc_en="1F1B: a few warm-up Forwards, then alternate one Forward and one Backward, then the remaining Backwards, then OptimizerStep(). Target: bubble (p-1)/(m+p-1), rank r holds at most p-r activations.")

CASES = [Case(Text("p=2, m=4", "p=2, m=4"), 2, {"m": 4, "seed": 31}),
         Case(Text("p=4, m=8", "p=4, m=8"), 4, {"m": 8, "seed": 32}),
         Case(Text("p=4, m=2 (m < p)", "p=4, m=2 (m < p)"), 4, {"m": 2, "seed": 33}),
         Case(Text("p=3, m=5", "p=3, m=5"), 3, {"m": 5, "seed": 34})]

MESSAGES = Text("스테이지 s>0의 Forward 앞에는 `RecvAct(mb, s, s-1)`, 스테이지 s<p-1의 Forward 뒤에는 `SendAct(mb, s, s+1)`. "
                "Backward는 반대 방향: 앞에 `RecvGrad(mb, s, s+1)`(마지막 스테이지 제외), 뒤에 `SendGrad(mb, s, s-1)`(스테이지 0 제외).",
                "Before a Forward of stage s>0: RecvAct(mb, s, s-1); after one of stage s<p-1: SendAct(mb, s, s+1). "
                "Backward goes the other way: RecvGrad(mb, s, s+1) before (not on the last stage), SendGrad(mb, s, s-1) "
                "after (not on stage 0).")

EXERCISES = [
    Exercise("gpipe_schedule", "04", Text("GPipe 스케줄", "The GPipe schedule"), STUB_GPIPE, (
        Text("GPipe는 채우고(모든 Forward) 비웁니다(모든 Backward). 계산 명령 사이에 통신 명령을 넣으세요.",
             "GPipe fills (every Forward) and drains (every Backward). Put the messages around the computations."),
        MESSAGES,
        Text("prog = []\nfor mb in range(m): [RecvAct] + Forward(mb, rank) + [SendAct]\nfor mb in range(m): [RecvGrad] + "
             "Backward(mb, rank) + [SendGrad]\nprog.append(OptimizerStep())",
             "prog = []\nfor mb in range(m): [RecvAct] + Forward(mb, rank) + [SendAct]\nfor mb in range(m): [RecvGrad] + "
             "Backward(mb, rank) + [SendGrad]\nprog.append(OptimizerStep())")),
        CASES, schedule_judge(_gpipe_property)),
    Exercise("one_f_one_b_schedule", "04", Text("1F1B 스케줄", "The 1F1B schedule"), STUB_1F1B, (
        Text("1F1B는 활성값을 오래 들고 있지 않도록 Backward를 가능한 한 일찍 시작합니다.",
             "1F1B starts Backwards as early as it can so activations are not held long."),
        Text("warm-up = min(p - 랭크 - 1, m)개의 Forward, 그다음 m - warm-up번 (Forward, Backward), 마지막으로 남은 Backward. "
             "랭크 r이 들고 있는 활성값은 최대 p - r개.",
             "warm-up = min(p - rank - 1, m) Forwards, then m - warm-up pairs (Forward, Backward), then the remaining "
             "Backwards. Rank r holds at most p - r activations."),
        Text("order = [F(k) for k in range(w)]; for k in range(m - w): order += [F(w + k), B(k)]; order += [B(k) for k in "
             "range(m - w, m)]. 각 F/B 앞뒤에 통신 명령을 붙이세요.",
             "order = [F(k) for k in range(w)]; for k in range(m - w): order += [F(w + k), B(k)]; order += [B(k) for k in "
             "range(m - w, m)]. Wrap each F/B in its messages.")),
        CASES, schedule_judge(_one_f_one_b_property, simulator_hint=_warmup_hint)),
]
