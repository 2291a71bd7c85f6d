"""Lab 02 exercise: which rank holds which layers, balanced by parameter count, and what each rank's
model state weighs — graded on the heaviest rank.

A layer-wise split gives rank r a run of consecutive layers (rank 0 the first). Each rank keeps its
layers' parameters, their gradients and the optimizer's state: in fp32, 4 + 4 bytes per parameter
plus 8 for Adam's two moments (plain SGD keeps none). The device that must fit is the heaviest, so
the cost target is the smallest possible peak: what ``mpkit.parallel.pipeline.split.partition``
(the split ``mpkit.train("mp")`` uses) reaches. Any split with that peak passes; an equal count of
layers per rank is right on its own terms but misses the target when layer sizes differ (lab 02's
gpt: the embedding and the head are light, the blocks heavy).
"""
from __future__ import annotations

from mpkit.exercises.common import Case, Exercise, failed, passed, pure_results
from mpkit.exercises.result import Text
from mpkit.models import ModelConfig, build_model
from mpkit.parallel.pipeline.split import partition

# fp32 model state per parameter: weight 4 + gradient 4 + optimizer state (Adam: two moments; SGD: none)
BYTES_PER_PARAMETER = {"adam": 16, "sgd": 8}


def layer_parameters(**config) -> list[int]:
    """Parameters per layer of a built-in model, in the order ``mpkit.train("mp")`` splits them."""
    model = build_model(ModelConfig(**config), 0)
    return [sum(p.numel() for p in layer.parameters()) for layer in model.layers]


def case_sizes(case) -> list[int]:
    """A case's layer sizes: given, or those of a built-in model (``"model"``: its config)."""
    return case.params["sizes"] if "sizes" in case.params else layer_parameters(**case.params["model"])


def reference(sizes, ranks, optimizer):
    """(stages, bytes per rank) of the balanced split: mpkit's own ``partition``."""
    stages = [list(group) for group in partition(list(sizes), ranks)]
    return stages, [sum(sizes[i] for i in stage) * BYTES_PER_PARAMETER[optimizer] for stage in stages]


def _as_stages(value, ranks):
    """The learner's stages as lists of ints, or None when they are not a list of ``ranks`` lists."""
    if not isinstance(value, (list, tuple)) or len(value) != ranks:
        return None
    try:
        return [[int(i) for i in stage] for stage in value]
    except (TypeError, ValueError):
        return None


SHAPE = Text("(stages, bytes_per_rank)를 돌려주세요: stages는 랭크마다 레이어 번호 목록(랭크 수만큼), bytes_per_rank는 랭크마다 정수.",
             "return (stages, bytes_per_rank): stages holds one list of layer indices per rank (as many as ranks), "
             "bytes_per_rank one whole number per rank.")
CONSECUTIVE = Text("레이어 단위 분할에서 랭크 r은 연속된 레이어를 가지고, 랭크 0이 맨 앞 레이어들을 가집니다: 모든 레이어를 순서대로 한 번씩, "
                   "랭크마다 적어도 하나.",
                   "in a layer-wise split rank r holds consecutive layers and rank 0 the first ones: every layer once, in "
                   "order, and at least one per rank.")
EQUAL_COUNT = Text("레이어 개수를 똑같이 나누었습니다: 레이어 크기가 다르면(02의 gpt에서는 임베딩과 헤드가 가볍고 블록이 무겁습니다) 가장 무거운 랭크가 커집니다. "
                   "가장 큰 랭크의 파라미터 수를 가장 작게 만드는 연속 분할을 찾으세요.",
                   "you split by layer count: when layers differ in size (in lab 02's gpt the embedding and the head "
                   "are light, the blocks heavy) the heaviest rank grows. Find the consecutive split whose largest rank holds the "
                   "fewest parameters.")
BETTER_SPLIT = Text("더 가벼운 최대 랭크가 있습니다: '평균(합/N)에 닿으면 자르기' 같은 탐욕적(greedy) 규칙은 최적을 놓칠 수 있습니다. 한계 L을 "
                    "정하고 앞에서부터 L을 넘기 전까지 채웠을 때 랭크 N개로 충분한지 보며, 충분한 가장 작은 L을 찾으세요(이분 탐색).",
                    "a lighter heaviest rank exists: a greedy rule such as 'cut when the running sum reaches the average' "
                    "can miss the optimum. Pick a limit L, fill ranks from the front without passing L, see whether N ranks "
                    "suffice, and find the smallest L that does (bisection).")


def _bytes_hint(got, want, per):
    """The classic slips in the bytes: only the weights, no optimizer state, or Adam's state for SGD."""
    if not all(isinstance(g, (int, float)) for g in got) or not any(want):
        return None
    factors = {got_b / want_b for got_b, want_b in zip(got, want) if want_b}
    if len(factors) != 1:
        return None
    factor = factors.pop() * per
    hints = {4: Text("가중치(4 B)만 셌습니다: 그래디언트(4 B)와 옵티마이저 상태도 파라미터마다 있습니다.",
                     "you counted only the weights (4 B): each parameter also has a gradient (4 B) and optimizer state."),
             8: Text("가중치와 그래디언트만 셌습니다: Adam은 파라미터마다 모멘트 두 개(fp32, 8 B)를 더 가집니다.",
                     "you counted weights and gradients only: Adam keeps two moments (fp32, 8 B) per parameter on top."),
             16: Text("일반 SGD(모멘텀 없음)는 옵티마이저 상태가 없습니다: 파라미터마다 가중치 4 B + 그래디언트 4 B.",
                      "plain SGD (no momentum) keeps no optimizer state: 4 B of weight + 4 B of gradient per parameter."),
             2: Text("2바이트로 셌습니다: 이 실습의 학습은 fp32(4바이트)입니다.", "you counted 2 bytes: this lab trains in fp32 (4 bytes).")}
    return hints.get(round(factor)) if abs(factor - round(factor)) < 1e-9 else None


def _judge(case, fn, timeout):
    sizes, ranks, optimizer = case_sizes(case), case.params["ranks"], case.params["optimizer"]
    got = pure_results(fn, [(list(sizes), ranks, optimizer)], timeout)[0]
    if not isinstance(got, (list, tuple)) or len(got) != 2:
        return failed(case, Text(f"두 값을 기대했는데 {got!r}입니다.", f"expected two values, got {got!r}."), SHAPE)
    stages, nbytes = _as_stages(got[0], ranks), got[1]
    if stages is None:
        return failed(case, Text(f"stages가 랭크 {ranks}개의 레이어 목록이 아닙니다: {got[0]!r}.",
                                 f"stages is not {ranks} lists of layer indices: {got[0]!r}."), SHAPE)
    if [i for stage in stages for i in stage] != list(range(len(sizes))) or not all(stages):
        return failed(case, Text(f"stages {stages}는 레이어 0..{len(sizes) - 1}을 순서대로 나눈 것이 아닙니다.",
                                 f"stages {stages} do not cut layers 0..{len(sizes) - 1} in order."), CONSECUTIVE)
    per = BYTES_PER_PARAMETER[optimizer]
    want = [sum(sizes[i] for i in stage) * per for stage in stages]
    if not isinstance(nbytes, (list, tuple)) or list(nbytes) != want:
        hint = _bytes_hint(nbytes, want, per) if isinstance(nbytes, (list, tuple)) and len(nbytes) == ranks else SHAPE
        return failed(case, Text(f"여러분의 stages {stages}에서 랭크별 바이트는 {want}이어야 하는데 {nbytes!r}입니다"
                                 f"({optimizer}: 파라미터마다 {per} B).",
                                 f"for your stages {stages} the bytes per rank are {want}, got {nbytes!r} ({optimizer}: "
                                 f"{per} B per parameter)."), hint)
    target = max(reference(sizes, ranks, optimizer)[1])
    if max(want) > target:
        heaviest = want.index(max(want))
        equal = [list(map(int, g)) for g in _equal_counts(len(sizes), ranks)]
        return failed(case, Text(f"가장 무거운 랭크 {heaviest}(레이어 {stages[heaviest]}): 측정 {max(want)} B, 목표 {target} B 이하"
                                 "(가장 무거운 랭크가 가장 가벼운 연속 분할).",
                                 f"the heaviest rank, {heaviest} (layers {stages[heaviest]}): measured {max(want)} B; the "
                                 f"target is at most {target} B (the consecutive split whose heaviest rank is lightest)."),
                      EQUAL_COUNT if stages == equal else BETTER_SPLIT)
    return passed(case, Text(f"가장 무거운 랭크 {max(want)} B = 목표", f"heaviest rank {max(want)} B = the target"))


def _equal_counts(layers, ranks):
    """Layer indices cut into ``ranks`` runs of equal count (the first ones one longer)."""
    base, extra = divmod(layers, ranks)
    bounds = [r * base + min(r, extra) for r in range(ranks + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


STUB = '''def balanced_stages(layer_parameters, ranks, optimizer):
    """레이어 단위 분할: 레이어 i의 파라미터 수가 layer_parameters[i]인 모델을 랭크 ranks개에 나눕니다. 랭크 r은 연속된 레이어를
    가지고(랭크 0이 맨 앞), 랭크마다 적어도 하나. 돌려줄 것: (stages, bytes_per_rank) — stages[r]는 랭크 r의 레이어 번호 목록,
    bytes_per_rank[r]는 랭크 r의 모델 상태 바이트: fp32로 파라미터마다 가중치 4 + 그래디언트 4 + 옵티마이저 상태(optimizer가
    "adam"이면 모멘트 두 개 8, "sgd"면 0). Adam의 스텝 카운터는 무시합니다.
    비용 목표: 가장 무거운 랭크의 바이트가 가능한 가장 작은 값(mpkit.train("mp")의 분할이 닿는 값).
    A layer-wise split of a model whose layer i has layer_parameters[i] parameters over `ranks` ranks: rank r
    holds consecutive layers (rank 0 the first), at least one each. Return (stages, bytes_per_rank): stages[r]
    lists rank r's layer indices, bytes_per_rank[r] is rank r's model state in bytes: in fp32, per parameter 4
    for the weight + 4 for the gradient + the optimizer state (optimizer "adam": two moments, 8; "sgd": 0).
    Ignore Adam's step counters. Cost target: the heaviest rank's bytes as small as they can be (what the split of
    mpkit.train("mp") reaches)."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

EXERCISES = [
    Exercise("balanced_stages", "02", Text("파라미터 수로 균형 잡은 분할과 랭크별 메모리",
                                           "A split balanced by parameter count, and each rank's memory"), STUB, (
        Text("레이어 단위 분할에서 장치에 들어가야 하는 것은 가장 무거운 랭크입니다: 레이어 개수가 아니라 파라미터 수로 나누세요.",
             "In a layer-wise split the device that must fit is the heaviest rank's: split by parameter count, not by "
             "number of layers."),
        Text("랭크 r의 바이트 = (그 레이어들의 파라미터 합) × (4 + 4 + Adam이면 8). 목표: max_r 바이트를 최소로 하는 연속 분할. "
             "한계 L로 앞에서부터 채울 때 필요한 랭크 수는 L이 클수록 줄어듭니다.",
             "Rank r's bytes = (its layers' parameters) × (4 + 4 + 8 for Adam). Target: the consecutive split "
             "minimising max_r bytes. Filling from the front under a limit L needs fewer ranks the larger L is."),
        Text("L의 범위는 max(layer_parameters) .. sum(layer_parameters)입니다. needed(L)이 ranks 이하인 가장 작은 L을 이분 탐색으로 "
             "찾고, 그 L로 다시 앞에서부터 채우되 뒤의 랭크마다 레이어가 적어도 하나 남도록 자르세요.",
             "L lies between max(layer_parameters) and sum(layer_parameters). Bisect for the smallest L with needed(L) <= "
             "ranks, then fill from the front again under that L, cutting early enough to leave every later rank at "
             "least one layer.")),
        [Case(Text("4 랭크, 02의 gpt(임베딩, 블록 8개, 헤드), Adam", "4 ranks, lab 02's gpt (embedding, 8 blocks, head), Adam"),
              1, {"model": {"kind": "gpt", "layers": 8, "hidden": 128}, "ranks": 4, "optimizer": "adam"}),
         Case(Text("3 랭크, 크기가 다른 레이어 7개, SGD", "3 ranks, 7 layers of different sizes, SGD"), 1,
              {"sizes": [5000, 9000, 2000, 2000, 7000, 3000, 8000], "ranks": 3, "optimizer": "sgd"}),
         Case(Text("3 랭크, 크기가 다른 레이어 8개, Adam", "3 ranks, 8 layers of different sizes, Adam"), 1,
              {"sizes": [7000, 1000, 1000, 6000, 2000, 5000, 3000, 4000], "ranks": 3, "optimizer": "adam"}),
         Case(Text("2 랭크, 무거운 첫 레이어, Adam", "2 ranks, a heavy first layer, Adam"), 1,
              {"sizes": [30000, 4000, 4000, 4000, 4000, 4000], "ranks": 2, "optimizer": "adam"})],
        _judge),
]
