"""Lab 10 exercises: where a rank sits on the dp x pp x tp grid, the process groups of a layout,
the groups in a given rank order (the lesson that orders differ: mpkit's and picotron's DP outermost,
Megatron-Core's PP outermost), and the model-state memory per GPU for a layout and ZeRO stage.

mpkit lays ranks out as ``mpkit.layout.Layout`` does (by default tensor parallel innermost, then
context, pipeline, data parallel outermost: with cp = 1, rank = (dp·pp + pp_index)·tp + tp_index;
``Layout(order=...)`` any other order), and prices memory with
``mpkit.simulator.formulas.zero_memory`` (mixed-precision Adam, 2 + 2 + 12 bytes per parameter); the
checker compares with both. Groups may come in any order.
"""
from __future__ import annotations

from mpkit.exercises.common import Case, Exercise, failed, passed, pure_results
from mpkit.exercises.result import Text
from mpkit.layout import DIMS as MESH_DIMS, Layout
from mpkit.simulator.formulas import zero_memory

LAYOUTS = [(2, 2, 2), (1, 4, 2), (4, 1, 2), (2, 3, 1)]
DIMS = ("dp", "pp", "tp")  # the exercises' grid: cp = 1


def _order_hint(layout, got_of):
    """Which dimension the learner made innermost, when it is not tp."""
    for dim in DIMS:
        if getattr(layout, dim) > 1 and got_of(1).get(dim) == 1 and dim != "tp":
            return Text(f"랭크 0과 1이 {dim} 좌표만 다릅니다: mpkit에서는 tp가 가장 안쪽(이웃한 랭크가 같은 TP 그룹)이고, 그다음 pp, "
                        "dp가 가장 바깥입니다.", f"ranks 0 and 1 differ in their {dim} coordinate: in mpkit tp is innermost "
                        "(adjacent ranks share a TP group), then pp, with dp outermost.")
    return Text("랭크 = (dp·PP + pp)·TP + tp를 거꾸로 푸세요: tp = 랭크 % TP, 그다음 (랭크 // TP) % PP, dp = 랭크 // (TP·PP).",
                "invert rank = (dp·PP + pp)·TP + tp: tp = rank % TP, then pp = (rank // TP) % PP, dp = rank // (TP·PP).")


PROBE = Layout(2, 3, 4)  # sizes all different: a reversed tuple and a reversed layout look alike only on a cube


def _reversed_everywhere(values, layout) -> bool:
    """Is every value the right coordinates in reverse, (tp, pp, dp)?"""
    return all(isinstance(v, (tuple, list)) and list(v)[::-1] == [layout.coords(r)[d] for d in DIMS]
               for r, v in enumerate(values))


def _judge_coords(case, fn, timeout):
    layout = Layout(*case.params["layout"])
    calls = [(rank, layout.dp, layout.pp, layout.tp) for rank in range(layout.world_size)]
    probe = [(rank, PROBE.dp, PROBE.pp, PROBE.tp) for rank in range(PROBE.world_size)]
    results = pure_results(fn, calls + probe, timeout)
    got, probed = results[:len(calls)], results[len(calls):]

    def as_dict(value):
        return dict(zip(DIMS, value)) if isinstance(value, (tuple, list)) and len(value) == 3 else value
    for rank, value in enumerate(got):
        want = {d: layout.coords(rank)[d] for d in DIMS}
        if as_dict(value) != want:
            hint, seen, seen_in = None, got, layout
            outside = [d for d in DIMS if isinstance(as_dict(value), dict) and isinstance(as_dict(value).get(d), int)
                       and not 0 <= as_dict(value)[d] < getattr(layout, d)]
            if outside:
                hint = Text(f"{outside[0]}_index {as_dict(value)[outside[0]]}이(가) 범위 0..{getattr(layout, outside[0]) - 1}을 "
                            f"벗어났습니다: 안쪽 차원의 좌표는 나머지(modulo, % {outside[0]}) 연산으로 구하세요.",
                            f"{outside[0]}_index {as_dict(value)[outside[0]]} is out of range 0..{getattr(layout, outside[0]) - 1}: "
                            f"take an inner coordinate modulo its size (% {outside[0]}).")
            if hint is None and isinstance(value, (tuple, list)) and list(value)[::-1] == list(want.values()) and \
                    _reversed_everywhere(probed, PROBE):
                hint = Text("배치는 맞는데 돌려준 순서가 거꾸로입니다: (tp, pp, dp)가 아니라 (dp, pp, tp) 순서로 돌려주세요.",
                            "the layout is right but the order of the tuple is reversed: return (dp, pp, tp), not (tp, pp, dp).")
            elif hint is None and isinstance(value, (tuple, list)) and list(value)[::-1] == list(want.values()):
                seen, seen_in = probed, PROBE  # a cube hides it: the layout is reversed (dp innermost), seen on 2x3x4
            if isinstance(as_dict(value), dict) and all(isinstance(as_dict(value).get(d), int) for d in DIMS) and \
                    all(as_dict(value)[d] == want[d] + 1 for d in DIMS):
                hint = Text("좌표는 0부터 셉니다: 랭크 0은 (0, 0, 0)입니다.", "coordinates count from 0: rank 0 is (0, 0, 0).")
            if hint is not None:
                return failed(case, Text(f"랭크 {rank}: 기댓값 (dp, pp, tp) = {tuple(want.values())}, 실제 {value!r}.",
                                         f"rank {rank}: expected (dp, pp, tp) = {tuple(want.values())}, got {value!r}."), hint)
            return failed(case, Text(f"랭크 {rank}: 기댓값 (dp, pp, tp) = {tuple(want.values())}, 실제 {value!r}.",
                                     f"rank {rank}: expected (dp, pp, tp) = {tuple(want.values())}, got {value!r}."),
                          _order_hint(seen_in, lambda r: as_dict(seen[r]) if isinstance(as_dict(seen[r]), dict) else {}))
    return passed(case)


def _normal(groups):
    return sorted(sorted(int(r) for r in g) for g in groups)


def _mixed_dims(layout, groups, dim) -> list:
    """The dimensions other than ``dim`` in which members of one of ``groups`` differ."""
    if not isinstance(groups, list) or not all(isinstance(g, list) and all(0 <= r < layout.world_size for r in g)
                                               for g in groups):
        return []
    return [d for d in DIMS if d != dim and any(len({layout.coords(r)[d] for r in g}) > 1 for g in groups)]


def _judge_groups(case, fn, timeout):
    layout = Layout(*case.params["layout"])
    got = pure_results(fn, [(layout.dp, layout.pp, layout.tp)], timeout)[0]
    if not isinstance(got, dict) or set(got) != set(DIMS):
        return failed(case, Text(f"{{'dp': ..., 'pp': ..., 'tp': ...}} 사전을 기대했는데 {got!r}입니다.",
                                 f"expected a dict {{'dp': ..., 'pp': ..., 'tp': ...}}, got {got!r}."))
    for dim in DIMS:
        want = _normal(layout.groups(dim))
        try:
            have = _normal(got[dim])
        except (TypeError, ValueError):
            have = got[dim]
        if have != want:
            if isinstance(have, list) and len(have) < len(want) and all(len(g) == 1 for g in want if g not in have):
                return failed(case, Text(f"{dim} 그룹: 기댓값 {want}, 실제 {have}.", f"{dim} groups: expected {want}, got {have}."),
                              Text("크기가 1인 차원에도 그룹이 있습니다: 랭크마다 하나씩, 크기 1인 그룹들.",
                                   "a dimension of size 1 still has groups: one per rank, each of size 1."))
            swapped = next((d for d in DIMS if d != dim and _normal(layout.groups(d)) == have), None)
            mixed = _mixed_dims(layout, have, dim)
            if swapped is None and mixed:
                hint = Text(f"{dim} 그룹이 {', '.join(mixed)} 좌표도 다른 랭크들을 묶었습니다: 한 {dim} 그룹은 {dim} 좌표만 다르고 "
                            "나머지 두 좌표는 같은 랭크들입니다. mpkit에서는 tp가 가장 안쪽, 그다음 pp, dp가 가장 바깥입니다.",
                            f"your {dim} groups join ranks that also differ in {', '.join(mixed)}: a {dim} group holds the "
                            f"ranks that differ only in their {dim} coordinate (the other two coordinates equal); in "
                            "mpkit tp is innermost, then pp, with dp outermost.")
                return failed(case, Text(f"{dim} 그룹: 기댓값 {want}, 실제 {have}.", f"{dim} groups: expected {want}, got {have}."),
                              hint)
            hint = (Text(f"'{dim}'에 넣은 그룹은 {swapped} 그룹입니다: 한 {dim} 그룹은 {dim} 좌표만 다른 랭크들입니다.",
                         f"what you gave as '{dim}' are the {swapped} groups: a {dim} group is the ranks that differ only "
                         f"in their {dim} coordinate.") if swapped else
                    Text("tp가 가장 안쪽입니다: TP 그룹은 이웃한 랭크들(0,1,...), DP 그룹의 랭크들은 PP·TP씩 떨어져 있습니다.",
                         "tp is innermost: a TP group is adjacent ranks (0, 1, ...); the ranks of a DP group are PP·TP "
                         "apart."))
            return failed(case, Text(f"{dim} 그룹: 기댓값 {want}, 실제 {have}.", f"{dim} groups: expected {want}, got {have}."),
                          hint)
    return passed(case)


ORDER_CASES = [  # (sizes, order outermost first, what the case is)
    ({"dp": 2, "pp": 2, "cp": 1, "tp": 2}, ("dp", "pp", "cp", "tp"),
     Text("mpkit·picotron의 순서(DP가 가장 바깥), dp=2 pp=2 tp=2", "mpkit's and picotron's order (DP outermost), dp=2 pp=2 tp=2")),
    ({"dp": 2, "pp": 2, "cp": 1, "tp": 2}, ("pp", "dp", "cp", "tp"),
     Text("Megatron-Core의 tp-cp-ep-dp-pp(안쪽부터), dp=2 pp=2 tp=2", "Megatron-Core's tp-cp-ep-dp-pp (innermost first), dp=2 pp=2 tp=2")),
    ({"dp": 2, "pp": 2, "cp": 2, "tp": 2}, ("pp", "dp", "cp", "tp"),
     Text("Megatron-Core의 순서, 4D 2x2x2x2", "Megatron-Core's order, 4-D 2x2x2x2")),
    ({"dp": 3, "pp": 1, "cp": 2, "tp": 2}, ("tp", "dp", "pp", "cp"),
     Text("흔치 않은 순서 tp-dp-pp-cp, dp=3 cp=2 tp=2", "an unusual order tp-dp-pp-cp, dp=3 cp=2 tp=2")),
]


def _order_layout(sizes, order):
    return Layout(dp=sizes["dp"], pp=sizes["pp"], tp=sizes["tp"], cp=sizes["cp"], order="-".join(order))


def _judge_ordered(case, fn, timeout):
    sizes, order = case.params["sizes"], case.params["order"]
    got = pure_results(fn, [(dict(sizes), tuple(order))], timeout)[0]
    call = f"groups_in_order({sizes}, {tuple(order)})"
    if not isinstance(got, dict) or set(got) != set(MESH_DIMS):
        return failed(case, Text(f"{call}: {{'dp': ..., 'pp': ..., 'cp': ..., 'tp': ...}} 사전을 기대했는데 {got!r}입니다.",
                                 f"{call}: expected a dict {{'dp': ..., 'pp': ..., 'cp': ..., 'tp': ...}}, got {got!r}."))
    try:
        have = {d: _normal(got[d]) for d in MESH_DIMS}
    except (TypeError, ValueError):
        return failed(case, Text(f"{call}: 그룹은 랭크 번호의 목록이어야 합니다; 실제 {got!r}.",
                                 f"{call}: each group must be a list of rank numbers; got {got!r}."))
    layout = _order_layout(sizes, order)
    want = {d: _normal(layout.groups(d)) for d in MESH_DIMS}
    wrong = next((d for d in MESH_DIMS if have[d] != want[d]), None)
    if wrong is None:
        return passed(case)
    detail = Text(f"{call}: {wrong} 그룹의 기댓값 {want[wrong]}, 실제 {have[wrong]}.",
                  f"{call}: {wrong} groups expected {want[wrong]}, got {have[wrong]}.")
    return failed(case, detail, _ordered_hint(sizes, order, have, wrong))


def _ordered_hint(sizes, order, have, wrong):
    """The classic mistakes: mpkit's default order whatever ``order`` says, ``order`` read innermost
    first, another dimension's groups under this name."""
    def groups_in(o):
        lay = _order_layout(sizes, o)
        return {d: _normal(lay.groups(d)) for d in MESH_DIMS}
    if tuple(order) != MESH_DIMS and have == groups_in(MESH_DIMS):
        return Text("order를 읽지 않았습니다: 이 그룹들은 mpkit의 기본 순서 dp-pp-cp-tp입니다. order의 첫 차원이 가장 바깥(가장 느리게 "
                    "바뀜), 마지막 차원이 가장 안쪽(이웃한 랭크)입니다.", "you ignored order: these are the groups of mpkit's "
                    "default dp-pp-cp-tp. The first dimension of order is outermost (changes slowest), the last "
                    "innermost (adjacent ranks).")
    if have == groups_in(tuple(reversed(order))):
        return Text("order를 거꾸로 읽었습니다: order는 가장 바깥 차원부터 씁니다(Megatron-Core의 \"tp-cp-ep-dp-pp\"는 안쪽부터 쓴 것이라 "
                    "바깥부터는 ('pp', 'dp', 'cp', 'tp')).", "you read order innermost first: order lists the dimensions "
                    "outermost first (Megatron-Core's \"tp-cp-ep-dp-pp\" is written innermost first: outermost first it "
                    "reads ('pp', 'dp', 'cp', 'tp')).")
    swapped = next((d for d in MESH_DIMS if d != wrong and have[wrong] == groups_in(order)[d]), None)
    if swapped:
        return Text(f"'{wrong}'에 넣은 그룹은 {swapped} 그룹입니다: 한 {wrong} 그룹은 {wrong} 좌표만 다른 랭크들입니다.",
                    f"what you gave as '{wrong}' are the {swapped} groups: a {wrong} group is the ranks that differ only "
                    f"in their {wrong} coordinate.")
    return None


MEMORY_CASES = [(7e9, 8, 1, 1, 0), (7e9, 8, 1, 1, 1), (7e9, 8, 1, 1, 2), (7e9, 8, 1, 1, 3), (175e9, 8, 8, 8, 1),
                (70e9, 4, 4, 2, 3), (13e9, 2, 2, 4, 2)]


def expected_memory(params, dp, pp, tp, zero_stage):
    return sum(zero_memory(params / (pp * tp), dp, zero_stage).values())


def _memory_hint(params, dp, pp, tp, stage, got):
    psi = params / (pp * tp)
    variants = [
        (16 * psi / dp, Text("모든 상태를 dp로 나누었습니다: stage 0은 아무것도 나누지 않고, ZeRO-1은 옵티마이저 상태(12Ψ)만, ZeRO-2는 "
                             "그래디언트까지, ZeRO-3만 파라미터까지 나눕니다.",
                             "you divided every state by dp: stage 0 shards nothing, ZeRO-1 only the optimizer state "
                             "(12Ψ), ZeRO-2 the gradients too, only ZeRO-3 the parameters.")),
        (sum(zero_memory(params, dp, stage).values()), Text("pp·tp로 나누지 않았습니다: 한 GPU는 모델의 1/(pp·tp)만 가집니다.",
                                                             "you did not divide by pp·tp: one GPU holds 1/(pp·tp) of the model.")),
        (sum(zero_memory(psi, dp * pp * tp, stage).values()), Text("ZeRO는 dp 그룹 안에서만 나눕니다(전체 GPU 수가 아니라 dp).",
                                                                    "ZeRO shards within the dp group only (dp, not every GPU).")),
        (sum(zero_memory(psi, dp, min(stage, 2)).values()), Text("ZeRO-3은 파라미터(2Ψ)까지 dp로 나눕니다.",
                                                                 "ZeRO-3 shards the parameters (2Ψ) across dp too.")),
        (sum(zero_memory(psi, dp, stage, 2, 2, 8).values()), Text("옵티마이저 상태는 12바이트입니다: fp32 마스터 가중치 4 + "
                                                                  "모멘텀 4 + 분산 4.", "the optimizer state is 12 bytes: "
                                                                  "fp32 master weights 4 + momentum 4 + variance 4.")),
        (sum(zero_memory(psi, dp, stage, 4, 4, 8).values()), Text("혼합 정밀도 Adam은 2+2+12 = 16바이트/파라미터입니다(fp32 4+4+8이 아님).",
                                                                  "mixed-precision Adam is 2+2+12 = 16 bytes per parameter "
                                                                  "(not fp32's 4+4+8).")),
    ]
    return next((hint for value, hint in variants if abs(got - value) <= 1e-6 * value), None)


def _judge_memory(case, fn, timeout):
    got = pure_results(fn, case.params["calls"], timeout)
    for args, value in zip(case.params["calls"], got):
        want = expected_memory(*args)
        params, dp, pp, tp, stage = args
        call = f"memory_per_gpu({params:.3g}, dp={dp}, pp={pp}, tp={tp}, zero_stage={stage})"
        if not isinstance(value, (int, float)) or abs(value - want) > 1e-6 * want:
            hint = _memory_hint(*args, value) if isinstance(value, (int, float)) else None
            return failed(case, Text(f"{call}: 기댓값 {want:.4g} B, 실제 {value!r}.", f"{call}: expected {want:.4g} B, got "
                                     f"{value!r}."), hint)
    return passed(case)


STUB_COORDS = '''def rank_coordinates(rank, dp, pp, tp):
    """dp x pp x tp 격자에서 랭크의 좌표 (dp_index, pp_index, tp_index). mpkit의 레이아웃: tp가 가장 안쪽(이웃한 랭크),
    그다음 pp, dp가 가장 바깥.
    The (dp_index, pp_index, tp_index) of rank on the dp x pp x tp grid. mpkit's layout: tp innermost
    (adjacent ranks), then pp, dp outermost."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''
STUB_GROUPS = '''def process_groups(dp, pp, tp):
    """{'dp': [...], 'pp': [...], 'tp': [...]}: 차원마다 그 차원의 좌표만 다른 랭크들의 목록(그룹)들. 예: dp=2, pp=1, tp=2 ->
    {'dp': [[0, 2], [1, 3]], 'pp': [[0], [1], [2], [3]], 'tp': [[0, 1], [2, 3]]}.
    For each dimension, the groups of ranks that differ only in that coordinate."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''
STUB_ORDERED = '''def groups_in_order(sizes, order):
    """{'dp': [...], 'pp': [...], 'cp': [...], 'tp': [...]}: 랭크를 order 순서(가장 바깥 차원부터)로 놓았을 때 차원마다의 그룹들
    (그 차원의 좌표만 다른 랭크들). sizes: {'dp': 2, 'pp': 2, 'cp': 1, 'tp': 2}; order: 예 ('dp', 'pp', 'cp', 'tp')(mpkit),
    ('pp', 'dp', 'cp', 'tp')(Megatron-Core). 마지막(가장 안쪽) 차원의 좌표가 가장 빨리 바뀝니다.
    The groups of every dimension (ranks that differ only in that coordinate) when ranks are laid out in
    order, outermost dimension first; the last (innermost) dimension's coordinate changes fastest."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''
STUB_MEMORY = '''def memory_per_gpu(params, dp, pp, tp, zero_stage):
    """혼합 정밀도 Adam(파라미터 2 + 그래디언트 2 + 옵티마이저 12 바이트)으로 GPU 하나가 가지는 모델 상태 바이트(활성값 제외).
    ZeRO-0/1/2/3은 dp 그룹 안에서 나눕니다.
    Model-state bytes per GPU (not activations) for mixed-precision Adam
    (2 parameter + 2 gradient + 12 optimizer bytes), ZeRO stage 0-3 sharding within the dp group."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''


def _layout_cases():
    return [Case(Text(f"dp={d}, pp={p}, tp={t}", f"dp={d}, pp={p}, tp={t}"), 1, {"layout": (d, p, t)})
            for d, p, t in LAYOUTS]


EXERCISES = [
    Exercise("rank_coordinates", "10", Text("랭크의 좌표", "A rank's coordinates"), STUB_COORDS, (
        Text("가장 안쪽 차원이 가장 빨리 바뀝니다: 랭크 0, 1, 2, ...는 먼저 tp 좌표가 바뀝니다.",
             "The innermost dimension changes fastest: ranks 0, 1, 2, ... step through tp first."),
        Text("rank = (dp_index·pp + pp_index)·tp + tp_index.", "rank = (dp_index·pp + pp_index)·tp + tp_index."),
        Text("rest, tp_index = divmod(rank, tp); dp_index, pp_index = divmod(rest, pp)",
             "rest, tp_index = divmod(rank, tp); dp_index, pp_index = divmod(rest, pp)")),
        _layout_cases(), _judge_coords),
    Exercise("process_groups", "10", Text("레이아웃의 프로세스 그룹", "A layout's process groups"), STUB_GROUPS, (
        Text("한 차원의 그룹 = 다른 두 좌표가 같은 랭크들.", "A group along one dimension = the ranks whose other two "
             "coordinates are equal."),
        Text("그룹 수 = (전체 랭크 수) / (그 차원의 크기). tp 그룹은 연속된 랭크, dp 그룹은 pp·tp 간격.",
             "Number of groups = world size / that dimension's size. TP groups are consecutive ranks; DP groups step by pp·tp."),
        Text("각 랭크의 좌표를 구해, 차원 d를 뺀 좌표를 키로 랭크들을 모으세요(dict.setdefault(key, []).append(랭크)).",
             "Compute each rank's coordinates and collect ranks under the key of the other two coordinates "
             "(dict.setdefault(key, []).append(rank)).")),
        _layout_cases(), _judge_groups),
    Exercise("groups_in_order", "10", Text("주어진 랭크 순서의 좌표와 그룹", "Coordinates and groups in a given rank order"),
             STUB_ORDERED, (
        Text("order의 마지막 차원이 가장 빨리 바뀝니다: 랭크 0, 1, 2, ...는 먼저 가장 안쪽 차원의 좌표가 바뀝니다. Megatron-Core의 "
             "\"tp-cp-ep-dp-pp\"는 안쪽부터 쓴 것이라 바깥부터는 ('pp', 'dp', 'cp', 'tp')입니다.",
             "The last dimension of order changes fastest: ranks 0, 1, 2, ... step through the innermost coordinate "
             "first. Megatron-Core's \"tp-cp-ep-dp-pp\" is written innermost first: outermost first it reads "
             "('pp', 'dp', 'cp', 'tp')."),
        Text("order = (d0, d1, d2, d3), 크기 n일 때 랭크 = ((c0·n1 + c1)·n2 + c2)·n3 + c3. 좌표는 가장 안쪽 차원부터 divmod로 풉니다.",
             "For order = (d0, d1, d2, d3) with sizes n: rank = ((c0·n1 + c1)·n2 + c2)·n3 + c3. Read the coordinates "
             "back with divmod, innermost dimension first."),
        Text("랭크마다 rest = 랭크; for d in reversed(order): rest, c[d] = divmod(rest, sizes[d]). 그다음 "
             "차원 d마다 d를 뺀 좌표를 키로 랭크를 모으세요(dict.setdefault(key, []).append(랭크)).",
             "for rank in range(world): rest = rank; for d in reversed(order): rest, c[d] = divmod(rest, sizes[d]). "
             "Then for each dimension d collect ranks under the key of the other coordinates "
             "(dict.setdefault(key, []).append(rank)).")),
        [Case(name, 1, {"sizes": sizes, "order": order}) for sizes, order, name in ORDER_CASES], _judge_ordered),
    Exercise("memory_per_gpu", "10", Text("레이아웃과 ZeRO 단계별 GPU당 메모리", "Memory per GPU by layout and ZeRO stage"),
             STUB_MEMORY, (
        Text("먼저 모델을 pp·tp로 나눈 뒤(GPU 하나의 몫 Ψ), ZeRO는 그 몫을 dp로 더 나눕니다.",
             "First split the model by pp·tp (one GPU's share Ψ); ZeRO then shards that share across dp."),
        Text("Ψ = params/(pp·tp). stage 0: 16Ψ; 1: 4Ψ + 12Ψ/dp; 2: 2Ψ + 14Ψ/dp; 3: 16Ψ/dp.",
             "Ψ = params/(pp·tp). stage 0: 16Ψ; 1: 4Ψ + 12Ψ/dp; 2: 2Ψ + 14Ψ/dp; 3: 16Ψ/dp."),
        Text("psi = params / (pp * tp)\nparam = 2*psi / (dp if stage >= 3 else 1); grad = 2*psi / (dp if stage >= 2 else 1); "
             "opt = 12*psi / (dp if stage >= 1 else 1)\nreturn param + grad + opt",
             "psi = params / (pp * tp)\nparam = 2*psi / (dp if stage >= 3 else 1); grad = 2*psi / (dp if stage >= 2 else 1); "
             "opt = 12*psi / (dp if stage >= 1 else 1)\nreturn param + grad + opt")),
        [Case(Text("ZeRO 0-3, dp=8", "ZeRO 0-3, dp=8"), 1, {"calls": MEMORY_CASES[:4]}),
         Case(Text("3D 레이아웃과 ZeRO", "3D layouts with ZeRO"), 1, {"calls": MEMORY_CASES[4:]})],
        _judge_memory),
]
