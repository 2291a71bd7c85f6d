"""Lab 04 exercises: the GPipe and 1F1B schedules as instruction lists (schedules as data).

The learner writes ``schedule(rank, p, m)`` -> rank's list of mpkit's pipeline instructions. The
checker takes every rank's list and (1) checks each micro-batch is computed once forward and once
backward, (2) plays the lists on the simulator (a deadlock or mismatched messages is named there,
with where each rank waits), (3) checks the schedule's defining property — GPipe: every forward
before any backward; 1F1B: rank r never holds more than p - r micro-batches' activations — and
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
from mpkit.parallel.pipeline.schedules import (Backward, Forward, OptimizerStep, RecvAct, RecvGrad, ScheduleError,
                                               SendAct, SendGrad, simulate)

KINDS = (Forward, Backward, SendAct, RecvAct, SendGrad, RecvGrad, OptimizerStep)
WIDTH, ROWS_PER_MB = 6, 2


def _lists_body(ctx, recorder, fn, p, m):
    return [recorder.call(fn, rank, p, m) for rank in range(p)]


def _model(seed, p):
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()) for _ in range(p)])


def _data(seed, m):
    g = seeded(seed)
    return torch.randn(m * ROWS_PER_MB, WIDTH, generator=g), torch.randn(m * ROWS_PER_MB, WIDTH, generator=g)


def _run_body(ctx, recorder, programs, seed):
    p, m = ctx.world_size, len([i for i in programs[0] if isinstance(i, Forward)])
    stage = _model(seed, p)[ctx.rank]
    x, y = _data(seed, m)
    executor = PipelineExecutor({ctx.rank: stage}, p, m, F.mse_loss, list(range(p)))
    executor.step(programs[ctx.rank], x if ctx.rank == 0 else None, y if ctx.rank == p - 1 else None)
    return grads(stage)


def _structure(case, programs, p, m):
    for rank, program in enumerate(programs):
        where = Text(f"랭크 {rank}의 목록:", f"rank {rank}'s list:")
        if not isinstance(program, list) or not all(isinstance(i, KINDS) for i in program):
            return failed(case, where + Text("명령(Forward, Backward, SendAct, ...)의 list여야 합니다.",
                                             "must be a list of instructions (Forward, Backward, SendAct, ...)."))
        for kind in (Forward, Backward):
            done = sorted(i.mb for i in program if isinstance(i, kind) and i.stage == rank)
            if done != list(range(m)) or any(isinstance(i, kind) and i.stage != rank for i in program):
                return failed(case, where + Text(f"{kind.__name__}(mb, stage={rank})가 마이크로배치 0..{m - 1}마다 정확히 한 번씩 "
                                                 f"있어야 하는데 {done}입니다.",
                                                 f"needs {kind.__name__}(mb, stage={rank}) exactly once for each "
                                                 f"micro-batch 0..{m - 1}; it has {done}."))
        for ins in program:
            peer = getattr(ins, "to", getattr(ins, "frm", None))
            if peer is None:
                continue
            neighbour = rank + 1 if isinstance(ins, (SendAct, RecvGrad)) else rank - 1
            if ins.stage != rank or peer != neighbour or not 0 <= neighbour < p:
                what = (Text(f"{ins}: 스테이지 {rank}에는 이런 메시지가 없습니다(그쪽에 이웃 스테이지가 없음).",
                             f"{ins}: stage {rank} has no such message (no neighbouring stage on that side).")
                        if not 0 <= neighbour < p else
                        Text(f"{ins}: 스테이지 {rank}의 이 메시지는 랭크 {neighbour}와 주고받아야 합니다.",
                             f"{ins}: this message of stage {rank} goes to or comes from rank {neighbour}."))
                return failed(case, where + what,
                              Text("활성값은 r → r+1(SendAct to=r+1, RecvAct frm=r-1), 그래디언트는 r+1 → r(RecvGrad frm=r+1, "
                                   "SendGrad to=r-1). 첫 스테이지는 활성값을 받지 않고 마지막 스테이지는 보내지 않습니다.",
                                   "activations go r -> r+1 (SendAct to=r+1, RecvAct frm=r-1), gradients r+1 -> r "
                                   "(RecvGrad frm=r+1, SendGrad to=r-1). The first stage receives no activation and the "
                                   "last sends none."))
        if not program or not isinstance(program[-1], OptimizerStep):
            return failed(case, where + Text("마지막 명령은 OptimizerStep()이어야 합니다.",
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


def _judge(kind):
    def judge(case, fn, timeout):
        p, m, seed = case.world_size, case.params["m"], case.params["seed"]
        programs = harness.run(_lists_body, 1, (fn, p, m), timeout)[0]["out"]
        problem = _structure(case, programs, p, m)
        if problem:
            return problem
        try:
            sim = simulate(programs)
        except ScheduleError as err:
            return failed(case, Text(f"시뮬레이터에서 실행할 수 없습니다: {err}", f"the simulator cannot run the lists: {err}"),
                          next(h for key, h in SIMULATOR_HINTS if key in str(err)))
        for rank, program in enumerate(programs):
            order = [i for i in program if isinstance(i, (Forward, Backward))]
            first_backward = next(k for k, i in enumerate(order) if isinstance(i, Backward))
            if kind == "gpipe" and first_backward < m:
                return failed(case, Text(f"랭크 {rank}: 모든 Forward 전에 Backward가 시작했습니다.",
                                         f"rank {rank}: a Backward starts before every Forward has run."),
                              Text("GPipe는 m개의 Forward를 모두 한 뒤에 Backward를 합니다(채우고, 비우기).",
                                   "GPipe runs all m Forwards, then the Backwards (fill, then drain)."))
            limit = min(m, p - rank)
            if kind == "1f1b" and sim.peak_in_flight[rank] > limit:
                return failed(case, Text(f"랭크 {rank}이(가) 한때 {sim.peak_in_flight[rank]}개 마이크로배치의 활성값을 들고 있습니다"
                                         f"(1F1B는 최대 {limit}).", f"rank {rank} holds the activations of "
                                         f"{sim.peak_in_flight[rank]} micro-batches at once (1F1B: at most {limit})."),
                              Text("준비 단계(warm-up)에서 랭크 r은 p-r-1개만 Forward하고, 그다음부터 Forward 하나와 Backward 하나를 "
                                   "번갈아 하세요.", "in the warm-up rank r runs only p-r-1 Forwards, then alternates one "
                                   "Forward and one Backward."))
        outputs = harness.run(_run_body, p, (programs, seed), timeout)
        model = _model(seed, p)
        x, y = _data(seed, m)
        F.mse_loss(model(x), y).backward()
        for rank, output in enumerate(outputs):
            problem = compare_grads(case, rank, grads(model[rank]), output["out"], p)
            if problem:
                return problem
        return passed(case, Text(f"버블 {float(sim.bubble):.0%}(단위 시간: forward 1, backward 2)",
                                 f"bubble {float(sim.bubble):.0%} (unit times: forward 1, backward 2)"))
    return judge


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
                        doc_ko="1F1B: 준비 단계(warm-up) Forward 몇 개, 그다음 Forward 하나·Backward 하나를 번갈아, 끝에 남은 Backward, OptimizerStep().",
                        doc_en="1F1B: a few warm-up Forwards, then alternate one Forward and one Backward, then the remaining Backwards, then OptimizerStep().")

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
        CASES, _judge("gpipe")),
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
        CASES, _judge("1f1b")),
]
