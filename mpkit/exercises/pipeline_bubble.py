"""Lab 04 exercises graded on the bubble: ZB-H1 (the backward split into B and W) and interleaved
1F1B, as instruction lists.

Correct is not enough here: every rank's list must also reach the schedule's bubble on the
simulator's unit costs, the figure lab 04 states, while holding no more activations than the
schedule it improves on. The checker is ``pipeline.schedule_judge``: the lists' structure, a play
on the simulator, the cost target below, then a real run whose gradients must equal the unsplit
model's. Any order that reaches the target passes; nothing is compared with the reference's list.

- ZB-H1 (Qi et al. 2024): with F = B = W = 1 slot, at most (p-1)(F+B-W) = p-1 idle slots per
  rank, i.e. a bubble of (p-1)/(3m+p-1) of the step (1F1B: (p-1)(F+B+W), (p-1)/(m+p-1)); a
  micro-batch's activations live from its F to its W, and no rank may hold more than p of them,
  1F1B's peak (its rank 0).
- Interleaved 1F1B, v = 2 chunks per rank (rank r holds stages r and r+p): bubble (p-1)/(v·m) of
  the ideal compute time (Narayanan et al. 2021), at most Megatron's 2(p-1) + (v-1)·p + 1 chunk
  activations on a rank.
"""
from __future__ import annotations

from fractions import Fraction

from mpkit.exercises.common import Case, Exercise, failed
from mpkit.exercises.pipeline import schedule_judge
from mpkit.exercises.result import Text
from mpkit.parallel.pipeline.schedules import Backward, BackwardInput, BackwardWeight, Forward, SendGrad

V = 2  # model chunks per rank in the interleaved exercise
SPLIT = (Forward, BackwardInput, BackwardWeight)
ZB_COSTS = {"forward": 1, "backward": 2, "weight": 1}  # F = B = W = 1 slot, as lab 04 §8


def _pct(x) -> str:
    return f"{float(x):.1%}"


def _computations(program):
    return [i for i in program if isinstance(i, (Forward, Backward, BackwardInput, BackwardWeight))]


def _grad_sent_after_w(programs) -> bool:
    """Whether some rank sends an input gradient only after the W of its micro-batch."""
    for program in programs:
        weights = set()
        for ins in program:
            if isinstance(ins, BackwardWeight):
                weights.add((ins.mb, ins.stage))
            elif isinstance(ins, SendGrad) and (ins.mb, ins.stage) in weights:
                return True
    return False


def _w_right_after_b(programs) -> bool:
    """Whether every rank runs each W at once after its B (nothing deferred)."""
    for program in programs:
        order = _computations(program)
        for i, ins in enumerate(order):
            after = order[i + 1] if i + 1 < len(order) else None
            if isinstance(ins, BackwardInput) and after != BackwardWeight(ins.mb, ins.stage):
                return False
    return True


def _zb_property(case, programs, sim, p, m):
    limit = min(m, p)
    for rank, peak in enumerate(sim.peak_in_flight):
        if peak > limit:
            return failed(case, Text(f"랭크 {rank}이(가) 한때 {peak}개 마이크로배치의 활성값을 들고 있습니다(목표: 최대 {limit}개, "
                                     f"1F1B의 최대치).", f"rank {rank} holds the activations of {peak} micro-batches at once "
                                     f"(target: at most {limit}, 1F1B's peak)."),
                          Text("마이크로배치의 활성값은 F부터 그 W까지 살아 있습니다: W를 끝까지 미루면 메모리가 m개까지 늘어납니다. "
                               "미뤄 둔 W가 쌓이면 다음 F 전에 가장 오래된 W를 실행하세요.",
                               "a micro-batch's activations live from its F until its W: deferring every W to the end "
                               "holds up to m of them. Once W's pile up, run the oldest before the next F."))
    target = Fraction(p - 1, 3 * m + p - 1)
    if sim.bubble <= target:
        return None
    detail = Text(f"버블이 스텝의 {_pct(sim.bubble)}입니다(F = B = W = 1칸). 목표는 ZB-H1의 (p-1)/(3m+p-1) = {_pct(target)}, "
                  f"곧 랭크마다 (p-1)(F+B-W) = {p - 1}칸입니다.",
                  f"the bubble is {_pct(sim.bubble)} of the step (F = B = W = 1 slot); the target is ZB-H1's "
                  f"(p-1)/(3m+p-1) = {_pct(target)}, i.e. (p-1)(F+B-W) = {p - 1} idle slots per rank.")
    if _grad_sent_after_w(programs):
        return failed(case, detail, Text("SendGrad가 W 뒤에 있습니다: 이전 스테이지는 다시 B+W를 기다립니다(1F1B와 같음). 입력 그래디언트는 "
                                         "B 바로 뒤에 보내세요: W는 메시지가 필요 없습니다.",
                                         "a SendGrad comes after the W: the previous stage waits for B+W again (as in "
                                         "1F1B). Send the input gradient right after B; W needs no message."))
    if _w_right_after_b(programs):
        return failed(case, detail, Text("모든 W가 자기 B 바로 뒤에 있습니다: 그러면 그래디언트는 빨리 보내도 랭크가 W를 하느라 다음 B를 늦게 "
                                         "시작해 1F1B와 거의 같아집니다. 뒤쪽 랭크일수록 W를 미뤄(랭크 r은 r개까지) 기다리던 칸을 채우세요.",
                                         "every W runs right after its B: the gradient leaves early, but the rank is "
                                         "busy with W when the next B could start, which is nearly 1F1B. Defer W on the "
                                         "later ranks (rank r keeps up to r pending) to fill the slots where they wait."))
    return failed(case, detail, Text("B를 먼저 계산해 바로 보내고, W는 랭크가 기다릴 칸에 넣으세요. 준비 단계는 1F1B와 같고(p-r-1개 F), "
                                     "랭크 r은 W를 r개까지 미뤄 둡니다.",
                                     "compute B first and send it at once; put W where the rank would wait. The warm-up "
                                     "is 1F1B's (p-r-1 forwards) and rank r keeps up to r W's pending."))


def _zb_measured(sim, p, m) -> Text:
    return Text(f"버블 {_pct(sim.bubble)}(목표 (p-1)/(3m+p-1) = {_pct(Fraction(p - 1, 3 * m + p - 1))}), 랭크별 최대 활성값 "
                f"{sim.peak_in_flight}(목표 최대 {min(m, p)})",
                f"bubble {_pct(sim.bubble)} (target (p-1)/(3m+p-1) = {_pct(Fraction(p - 1, 3 * m + p - 1))}), activations "
                f"in flight per rank {sim.peak_in_flight} (target at most {min(m, p)})")


def _interleaved_measured(sim, p, m) -> Text:
    of_ideal, limit = sim.bubble / (1 - sim.bubble), min(V * m, 2 * (p - 1) + (V - 1) * p + 1)
    return Text(f"버블은 이상적인 계산 시간의 {_pct(of_ideal)}(목표 (p-1)/(v·m) = {_pct(Fraction(p - 1, V * m))}), 랭크별 최대 "
                f"청크 활성값 {sim.peak_in_flight}(목표 최대 {limit})",
                f"bubble {_pct(of_ideal)} of the ideal compute time (target (p-1)/(v·m) = {_pct(Fraction(p - 1, V * m))}), "
                f"chunk activations in flight per rank {sim.peak_in_flight} (target at most {limit})")


def interleaved_placement(p) -> list[int]:
    """Stage s on rank s % p: rank r holds stages r and r+p."""
    return [s % p for s in range(V * p)]


def _interleaved_property(case, programs, sim, p, m):
    limit = min(V * m, 2 * (p - 1) + (V - 1) * p + 1)
    for rank, peak in enumerate(sim.peak_in_flight):
        if peak > limit:
            return failed(case, Text(f"랭크 {rank}이(가) 한때 청크 활성값 {peak}개를 들고 있습니다(목표: 최대 {limit}개, Megatron의 "
                                     f"2(p-1) + (v-1)·p + 1).", f"rank {rank} holds {peak} chunk activations at once (target: "
                                     f"at most {limit}, Megatron's 2(p-1) + (v-1)·p + 1)."),
                          Text("모든 Forward를 먼저 하면(GPipe처럼) 활성값이 v·m개까지 쌓입니다: 준비 Forward 뒤에는 Forward 하나와 "
                               "Backward 하나를 번갈아 하세요.", "running every Forward first (as GPipe) holds up to v·m "
                               "activations: after the warm-up forwards, alternate one Forward and one Backward."))
    target = Fraction(p - 1, V * m)
    of_ideal = sim.bubble / (1 - sim.bubble)
    if of_ideal <= target:
        return None
    return failed(case, Text(f"버블이 이상적인 계산 시간의 {_pct(of_ideal)}입니다(청크의 F 1칸, B 2칸). 목표는 (p-1)/(v·m) = "
                             f"{_pct(target)}입니다.", f"the bubble is {_pct(of_ideal)} of the ideal compute time (a chunk's "
                             f"F 1 slot, B 2); the target is (p-1)/(v·m) = {_pct(target)}."),
                  Text("마이크로배치를 p개씩 묶어 청크 0을 지나게 한 뒤 같은 묶음을 청크 1로 보내세요(역전파는 청크 1부터). 청크 하나씩 "
                       "모든 마이크로배치를 돌리면(looped) 채우기 구간이 짧아지지 않습니다.",
                       "take the micro-batches in groups of p through chunk 0, then the same group through chunk 1 "
                       "(backward: chunk 1 first). Running every micro-batch through one chunk before the next (looped) "
                       "does not shorten the fill."))


SHORT_WARMUP = Text("준비 Forward가 모자랍니다: 인터리브드의 k번째 Backward는 다른 청크의 마이크로배치라서, Megatron은 1F1B보다 긴 "
                    "min((p-r-1)·2 + (v-1)·p, v·m)개의 Forward를 먼저 합니다. 그보다 적으면 아직 Forward하지 않은 것을 "
                    "Backward하거나 메시지 순서가 어긋납니다.",
                    "too few warm-up forwards: the interleaved k-th Backward belongs to another chunk's micro-batch, so "
                    "Megatron runs min((p-r-1)·2 + (v-1)·p, v·m) forwards first, more than 1F1B. Fewer, and a Backward "
                    "comes before its Forward or the messages cross.")


def _short_warmup(programs, p, m):
    """SHORT_WARMUP when some rank runs fewer forwards before its first backward than Megatron."""
    for rank, program in enumerate(programs):
        order = _computations(program)
        first = next((k for k, ins in enumerate(order) if isinstance(ins, Backward)), len(order))
        if first < min(2 * (p - rank - 1) + (V - 1) * p, V * m):
            return SHORT_WARMUP
    return None


STUB_ZB = '''def zb_h1_schedule(rank, p, m):
    """ZB-H1 (제로 버블, Qi et al. 2024): 랭크 r의 명령 목록. 역전파를 BackwardInput(mb, stage)(B: 입력 그래디언트, 이전
    스테이지가 기다림, 뒤에 SendGrad)과 BackwardWeight(mb, stage)(W: 가중치 그래디언트, 아무도 기다리지 않음, 메시지 없음)로
    나눕니다. 랭크 r은 스테이지 r, 마이크로배치 0..m-1, m >= p. 마지막은 OptimizerStep().
    목표(단위 비용 F = B = W = 1칸): 버블은 스텝의 (p-1)/(3m+p-1), 곧 랭크마다 (p-1)(F+B-W) = p-1칸(1F1B는 3(p-1)칸).
    마이크로배치의 활성값은 F부터 W까지 살아 있고, 어느 랭크도 한때 p개를 넘게 들고 있으면 안 됩니다(1F1B의 최대치).
    ZB-H1 (zero bubble): rank r's instruction list, the backward split into BackwardInput(mb, stage) (B: the input
    gradient the previous stage waits for; SendGrad after it) and BackwardWeight(mb, stage) (W: the weight gradient,
    nobody waits, no message). Rank r holds stage r; micro-batches 0..m-1, m >= p; end with OptimizerStep().
    Target on unit costs F = B = W = 1 slot: a bubble of (p-1)/(3m+p-1) of the step, i.e. (p-1)(F+B-W) = p-1 idle
    slots per rank (1F1B: 3(p-1)); a micro-batch's activations live from its F to its W, and no rank may hold more
    than p at once (1F1B's peak).
    명령 / instructions: Forward, BackwardInput, BackwardWeight, RecvAct(mb, stage, frm), SendAct(mb, stage, to),
    RecvGrad(mb, stage, frm), SendGrad(mb, stage, to), OptimizerStep()  (mpkit.parallel.pipeline.schedules)."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''
STUB_INTERLEAVED = '''def interleaved_schedule(rank, p, m):
    """인터리브드 1F1B(Megatron, v=2): 랭크 r의 명령 목록. 스테이지는 0..2p-1, 스테이지 s는 랭크 s % p에 있으므로 랭크 r은
    청크 두 개(스테이지 r과 r+p)를 가집니다. 마이크로배치 0..m-1, m은 p의 배수. 마지막은 OptimizerStep().
    목표(단위 비용: 청크의 Forward 1칸, Backward 2칸): 버블은 이상적인 계산 시간의 (p-1)/(v·m), 어느 랭크도 한때 청크 활성값을
    2(p-1) + (v-1)·p + 1개(Megatron의 랭크 0)보다 많이 들고 있으면 안 됩니다. 같은 목표에 닿는 어떤 순서든 통과합니다.
    Interleaved 1F1B (Megatron, v=2): rank r's instruction list. Stages are 0..2p-1 and stage s lives on rank s % p,
    so rank r holds two chunks, stages r and r+p. Micro-batches 0..m-1, m a multiple of p; end with OptimizerStep().
    Target on unit costs (a chunk's Forward 1 slot, Backward 2): a bubble of (p-1)/(v·m) of the ideal compute time,
    and no rank holding more than 2(p-1) + (v-1)·p + 1 chunk activations at once (Megatron's rank 0). Any order
    reaching the target passes.
    명령 / instructions: Forward(mb, stage), Backward(mb, stage), RecvAct(mb, stage, frm), SendAct(mb, stage, to),
    RecvGrad(mb, stage, frm), SendGrad(mb, stage, to), OptimizerStep()  (mpkit.parallel.pipeline.schedules)."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

EXERCISES = [
    Exercise("zb_h1_schedule", "04", Text("제로 버블 ZB-H1 스케줄", "The zero-bubble ZB-H1 schedule"), STUB_ZB, (
        Text("1F1B에서 이전 스테이지는 B+W가 끝나야 그래디언트를 받습니다. B만 먼저 하고 바로 보내면 기다림이 줄고, 아무도 기다리지 않는 "
             "W는 랭크가 쉬던 칸에 넣을 수 있습니다.",
             "In 1F1B the previous stage gets its gradient only after B+W. Running B alone and sending it at once cuts "
             "the wait, and W, which nobody waits for, can go where the rank used to idle."),
        Text("준비 단계: 1F1B처럼 min(p-r-1, m)개의 F. 정상 구간: F, B 쌍. 랭크 r은 미룬 W를 r개까지 들고 있다가 그보다 많아지면 "
             "가장 오래된 W를 B 뒤에 실행하고, 남은 W는 끝에. 그러면 모든 랭크가 최대 p개 마이크로배치의 활성값을 들고 있습니다"
             "(랭크 r: 준비 p-r-1개 + 1 + 미룬 W r개).",
             "Warm-up: min(p-r-1, m) F, as 1F1B. Steady state: F, B pairs. Rank r keeps up to r W's pending; when more "
             "are pending it runs the oldest after the B; the rest at the end. Then every rank holds at most p "
             "micro-batches' activations (rank r: p-r-1 warm-up + 1 + r deferred W)."),
        Text("계산 순서를 먼저 만들고(F, B, W 튜플의 목록) 그다음 각 F 앞뒤에 RecvAct/SendAct, 각 B 앞뒤에 RecvGrad/SendGrad를 "
             "붙이세요. W에는 메시지가 없습니다. 미룬 W는 큐(list.pop(0))로 관리하면 됩니다.",
             "Build the compute order first (a list of F, B, W tuples), then wrap each F in RecvAct/SendAct and each B "
             "in RecvGrad/SendGrad; W has no messages. A queue (list.pop(0)) holds the deferred W's.")),
        [Case(Text("p=2, m=4", "p=2, m=4"), 2, {"m": 4, "seed": 51}),
         Case(Text("p=3, m=5", "p=3, m=5"), 3, {"m": 5, "seed": 52}),
         Case(Text("p=4, m=8", "p=4, m=8"), 4, {"m": 8, "seed": 53}),
         Case(Text("p=4, m=4 (m = p)", "p=4, m=4 (m = p)"), 4, {"m": 4, "seed": 54})],
        schedule_judge(_zb_property, kinds=SPLIT, costs=ZB_COSTS, describe=_zb_measured)),
    Exercise("interleaved_schedule", "04", Text("인터리브드 1F1B 스케줄", "The interleaved 1F1B schedule"), STUB_INTERLEAVED, (
        Text("청크가 작으면 채우기·비우기 구간도 v배 짧아집니다. 마이크로배치는 랭크 0 → p-1을 두 번 돕니다: 청크 0(스테이지 0..p-1), "
             "그다음 청크 1(스테이지 p..2p-1).",
             "Smaller chunks make the fill and drain v times shorter. A micro-batch goes round ranks 0 -> p-1 twice: "
             "through chunk 0 (stages 0..p-1), then chunk 1 (stages p..2p-1)."),
        Text("Megatron의 순서: k번째 Forward는 마이크로배치 (k // (p·v))·p + k % p를 청크 (k // p) % v로, k번째 Backward는 같은 "
             "마이크로배치를 청크 v-1-(k // p) % v로. 준비 Forward는 min((p-r-1)·2 + (v-1)·p, v·m)개, 그다음 (F, B) 쌍, 남은 B.",
             "Megatron's order: the k-th Forward is micro-batch (k // (p·v))·p + k % p on chunk (k // p) % v, the k-th "
             "Backward the same micro-batch on chunk v-1-(k // p) % v. Warm-up: min((p-r-1)·2 + (v-1)·p, v·m) Forwards, "
             "then (F, B) pairs, then the remaining B."),
        Text("스테이지 s = 청크·p + r. 순서를 (종류, mb, s)의 목록으로 만든 뒤 각 계산 앞뒤에 메시지를 붙이세요: Forward 앞에 "
             "RecvAct(mb, s, (s-1) % p)(s > 0), 뒤에 SendAct(mb, s, (s+1) % p)(s < 2p-1); Backward는 그 반대.",
             "Stage s = chunk·p + r. Build the order as (kind, mb, s) tuples, then wrap each computation in its messages: "
             "RecvAct(mb, s, (s-1) % p) before a Forward (s > 0), SendAct(mb, s, (s+1) % p) after (s < 2p-1); the "
             "Backward the other way round.")),
        [Case(Text("p=2, m=4", "p=2, m=4"), 2, {"m": 4, "seed": 55}),
         Case(Text("p=3, m=6", "p=3, m=6"), 3, {"m": 6, "seed": 56}),
         Case(Text("p=4, m=8", "p=4, m=8"), 4, {"m": 8, "seed": 57}),
         Case(Text("p=2, m=2 (m = p)", "p=2, m=2 (m = p)"), 2, {"m": 2, "seed": 58})],
        schedule_judge(_interleaved_property, where_of=interleaved_placement, describe=_interleaved_measured,
                       simulator_hint=_short_warmup)),
]
