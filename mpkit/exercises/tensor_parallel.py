"""Lab 03 exercises: Megatron's f and g operators as autograd Functions, then an MLP with exactly
one all-reduce in its forward.

f (copy to the parallel region): identity forward, all-reduce of the input gradient backward.
g (reduce from the parallel region): all-reduce of the partial outputs forward, identity backward.
A column-parallel layer after f and a row-parallel layer before g make the MLP; the checker
compares its output and every gradient with the unsplit MLP and counts the all-reduces of the
forward and of the backward (one each).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mpkit.exercises import harness
from mpkit.exercises.common import Case, Exercise, close, factor_hint, failed, mismatch, passed, ratio, seeded
from mpkit.exercises.result import Text
from mpkit.parallel.tensor_parallel import copy_to_parallel_region, reduce_from_parallel_region

IN, HIDDEN, OUT, ROWS = 6, 8, 4, 5


def _weights(seed):
    g = seeded(seed)
    return {"x": torch.randn(ROWS, IN, generator=g), "w1": torch.randn(HIDDEN, IN, generator=g) * 0.5,
            "b1": torch.randn(HIDDEN, generator=g) * 0.1, "w2": torch.randn(OUT, HIDDEN, generator=g) * 0.5,
            "b2": torch.randn(OUT, generator=g) * 0.1, "target": torch.randn(ROWS, OUT, generator=g)}


def _shards(w, rank, n):
    rows = torch.arange(HIDDEN).tensor_split(n)[rank]
    return {"w1": w["w1"][rows], "b1": w["b1"][rows], "w2": w["w2"][:, rows], "b2": w["b2"]}


def _leaves(tensors):
    return {k: v.clone().requires_grad_() for k, v in tensors.items()}


def _reference(seed, n):
    w = _weights(seed)
    leaves = _leaves({k: w[k] for k in ("x", "w1", "b1", "w2", "b2")})
    z = F.linear(F.gelu(F.linear(leaves["x"], leaves["w1"], leaves["b1"])), leaves["w2"], leaves["b2"])
    F.mse_loss(z, w["target"]).backward()
    per_rank = []
    for rank in range(n):
        rows = torch.arange(HIDDEN).tensor_split(n)[rank]
        per_rank.append({"z": z.detach(), "x": leaves["x"].grad, "w1": leaves["w1"].grad[rows],
                         "b1": leaves["b1"].grad[rows], "w2": leaves["w2"].grad[:, rows], "b2": leaves["b2"].grad})
    return per_rank


def _run_mlp(ctx, recorder, seed, forward):
    w = _weights(seed)
    leaves = _leaves({"x": w["x"], **_shards(w, ctx.rank, ctx.world_size)})
    recorder.phase = "forward"
    z = recorder.call(forward, leaves)
    recorder.phase = "backward"
    recorder.call(F.mse_loss(z, w["target"]).backward)
    return {"z": z.detach(), **{k: None if v.grad is None else v.grad.clone() for k, v in leaves.items()}}


COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "reduce", "broadcast", "all_to_all", "all_to_all_single")


def _pair_body(ctx, recorder, pair, seed):
    f, g = pair

    changed = []

    def forward(p):
        h = F.linear(f.apply(p["x"]), p["w1"], p["b1"])
        partial = F.linear(F.gelu(h), p["w2"])
        before = partial.detach().clone()
        out = g.apply(partial)
        changed.append(not torch.equal(before, partial.detach()))
        return out + p["b2"]
    return _run_mlp(ctx, recorder, seed, forward) | {"g_changed_its_input": changed[0] if changed else False}


def _mlp_body(ctx, recorder, fn, seed):
    def forward(p):
        return fn(p["x"], p["w1"], p["b1"], p["w2"], p["b2"], copy_to_parallel_region, reduce_from_parallel_region)
    return _run_mlp(ctx, recorder, seed, forward)


NAMES = {"z": ("출력", "the output"), "x": ("입력의 그래디언트", "the input's gradient"),
         "w1": ("열 병렬 가중치의 그래디언트", "the column layer's weight gradient"),
         "b1": ("열 병렬 편향의 그래디언트", "the column layer's bias gradient"),
         "w2": ("행 병렬 가중치의 그래디언트", "the row layer's weight gradient"),
         "b2": ("행 병렬 편향의 그래디언트", "the row layer's bias gradient")}

COUNT_HINTS = {
    ("forward", 0): Text("순전파에 all-reduce가 없습니다: g의 forward가 랭크들의 부분합을 all-reduce해야 합니다.",
                         "the forward has no all-reduce: g's forward must all-reduce the ranks' partial sums."),
    ("backward", 0): Text("역전파에 all-reduce가 없습니다: f(x)를 빠뜨렸거나 f의 backward가 all-reduce하지 않아, 입력의 그래디언트"
                          "(x.grad)가 이 랭크의 부분합에 머뭅니다.",
                          "the backward has no all-reduce: f(x) is missing, or f's backward does not all-reduce, so the "
                          "input's gradient (x.grad) stays this rank's partial sum."),
    ("forward", 2): Text("순전파에 all-reduce가 두 번입니다: 열 병렬 레이어의 출력은 나뉜 채로 행 병렬 레이어로 갑니다. "
                         "all-reduce는 행 병렬 레이어 뒤(g)에 한 번만.",
                         "two all-reduces in the forward: the column layer's output stays split into the row layer; "
                         "all-reduce once, after the row layer (g)."),
    ("backward", 2): Text("역전파에 all-reduce가 두 번입니다: g의 backward는 항등(identity)이어야 합니다.",
                          "two all-reduces in the backward: g's backward is the identity."),
}


def _output_hint(seed, n, got) -> Text:
    """The classic mistakes between the two layers, recognised by the output they produce."""
    w = _weights(seed)
    x, w1, b1, w2, b2 = (w[k] for k in ("x", "w1", "b1", "w2", "b2"))
    variants = (
        (F.linear(F.gelu(F.linear(x, w1, b1)), w2, n * b2),
         Text("행 병렬 레이어의 편향(down_bias)이 랭크 수만큼 더해졌습니다: g의 all-reduce 뒤에 한 번만 더하세요.",
              "the row layer's bias (down_bias) was added once per rank: add it once, after g's all-reduce.")),
        (F.linear(F.gelu(F.linear(x, w1, b1)), w2),
         Text("행 병렬 레이어의 편향(down_bias)이 빠졌습니다: g 뒤에 한 번 더하세요.",
              "the row layer's bias (down_bias) is missing: add it once, after g.")),
        (F.linear(F.gelu(F.linear(x, w1)), w2, b2),
         Text("열 병렬 레이어의 편향(up_bias)이 빠졌습니다: 이 랭크의 편향 조각을 GeLU 앞에서 더하세요(이미 이 랭크의 몫이니 다시 "
              "자르지 마세요).", "the column layer's bias (up_bias) is missing: add this rank's slice before the GeLU (it "
              "is already this rank's slice: do not cut it again).")),
        (F.linear(F.gelu(F.linear(x, w1)) + b1, w2, b2),
         Text("열 병렬 레이어의 편향(up_bias)을 GeLU 뒤에 더했습니다: GeLU 앞에 더하세요.",
              "the column layer's bias (up_bias) was added after the GeLU: add it before.")),
        (F.linear(F.linear(x, w1, b1), w2, b2),
         Text("GeLU가 빠졌습니다: 열 병렬 레이어의 출력에 F.gelu를 씌운 뒤 행 병렬 레이어로 보내세요.",
              "the GeLU is missing: apply F.gelu to the column layer's output before the row layer.")),
        (F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2),
         Text("GeLU의 tanh 근사를 썼습니다: 기준은 정확한 F.gelu(approximate='none')입니다.",
              "the tanh approximation of GeLU was used: the reference is the exact F.gelu (approximate='none').")),
        (F.gelu(F.linear(F.linear(x, w1, b1), w2, b2)),
         Text("GeLU를 g의 all-reduce 뒤에 씌웠습니다: GeLU는 두 레이어 사이, 각 랭크의 자기 특성에 작용합니다.",
              "the GeLU was applied after g's all-reduce: it belongs between the layers, on each rank's own "
              "features.")),
    )
    found = next((hint for value, hint in variants if close(value, got)), None)
    return found or Text("통신 횟수는 맞는데 출력이 다릅니다: 두 레이어 사이의 계산을 하나씩 보세요: up_weight와 up_bias(열 병렬, "
                         "x @ up_weight.T + up_bias), F.gelu, down_weight(행 병렬, h @ down_weight.T), 그다음 g, 끝으로 "
                         "down_bias 한 번.", "the communication is right but the output is not: check each step between "
                         "the layers: up_weight and up_bias (column layer, x @ up_weight.T + up_bias), F.gelu, down_weight "
                         "(row layer, h @ down_weight.T), then g, then down_bias once.")


def _judge_with(body):
    def judge(case, fn, timeout):
        n, seed = case.world_size, case.params["seed"]
        outputs = harness.run(body, n, (fn, seed), timeout)
        for rank, output in enumerate(outputs):
            for phase in ("forward", "backward"):
                reduces = [c for c in output["calls"] if c.kind in COLLECTIVES and c.phase == phase]
                sizes = {c.numel for c in reduces}
                if phase == "forward" and sizes == {ROWS * IN}:
                    return failed(case, Text(f"랭크 {rank}: 순전파에서 입력 크기({ROWS}x{IN})의 텐서를 all-reduce했습니다.",
                                             f"rank {rank}: the forward all-reduced a tensor of the input's size "
                                             f"({ROWS}x{IN})."),
                                  Text("f와 g가 바뀌었습니다: f(열 병렬 앞)는 순전파에서 항등, g(행 병렬 뒤)가 all-reduce합니다.",
                                       "f and g are swapped: f (before the column layer) is the identity forward; g "
                                       "(after the row layer) all-reduces."))
                hint = COUNT_HINTS.get((phase, min(len(reduces), 2)))
                if hint is not None:
                    return failed(case, Text(f"랭크 {rank}: {dict(forward='순전파', backward='역전파')[phase]}의 집합 통신 "
                                             f"{len(reduces)}번.",
                                             f"rank {rank}: {len(reduces)} collective(s) in the {phase}."), hint)
            if output["out"].get("g_changed_its_input"):
                return failed(case, Text(f"랭크 {rank}: g가 입력 텐서를 제자리에서 바꾸었습니다.",
                                         f"rank {rank}: g changed its input tensor in place."),
                              Text("autograd Function의 입력은 바꾸지 마세요(다른 곳에서 쓰일 수 있음): x.clone()을 all-reduce해서 "
                                   "돌려주세요.", "never modify an autograd Function's input in place (someone else may "
                                   "hold it): all-reduce a clone, x.clone(), and return that."))
        expected = _reference(seed, n)
        for rank, (want, output) in enumerate(zip(expected, outputs)):
            for key, (ko, en) in NAMES.items():
                got = output["out"][key]
                if not close(want[key], got):
                    hint = factor_hint(ratio(want[key], got), n, "sum")
                    if key == "z" and hint is None:
                        hint = _output_hint(seed, n, got)
                    return failed(case, mismatch(Text(f"랭크 {rank}, {ko}:", f"rank {rank}, {en}:"), want[key], got), hint)
        return passed(case)
    return judge


STUB_PAIR = '''class CopyToParallelRegion(torch.autograd.Function):
    """f: 순전파는 항등(identity), 역전파는 입력 그래디언트를 모든 랭크에 걸쳐 all-reduce(합).
    f: identity in the forward; all-reduce (sum) of the input's gradient over all ranks in the backward."""

    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")


class ReduceFromParallelRegion(torch.autograd.Function):
    """g: 순전파는 랭크들의 부분 출력을 all-reduce(합), 역전파는 항등.
    g: all-reduce (sum) of the ranks' partial outputs in the forward; identity in the backward."""

    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''
STUB_MLP = '''def megatron_mlp(x, up_weight, up_bias, down_weight, down_bias, f, g):
    """Megatron MLP: gelu(x·W1ᵀ+b1)·W2ᵀ+b2. 이 랭크는 W1의 행(출력 특성) 몫 up_weight와 up_bias(열 병렬),
    W2의 열(입력 특성) 몫 down_weight(행 병렬), 그리고 전체 down_bias를 가집니다. f와 g는 Megatron의 연산자입니다
    (f(x), g(x)로 부르세요). 순전파의 all-reduce는 정확히 한 번.
    The Megatron MLP gelu(x·W1ᵀ+b1)·W2ᵀ+b2. This rank holds its rows (output features) of W1 as up_weight and
    up_bias (column parallel), its columns (input features) of W2 as down_weight (row parallel), and the whole
    down_bias. f and g are Megatron's operators (call f(x), g(x)). Exactly one all-reduce in the forward."""
    raise NotImplementedError("연습: 여기를 채우세요 / exercise: write this")
'''

CASES = [Case(Text("2 랭크", "2 ranks"), 2, {"seed": 21}), Case(Text("4 랭크", "4 ranks"), 4, {"seed": 22}),
         Case(Text("3 랭크(8개 특성을 3,3,2로)", "3 ranks (8 features as 3, 3, 2)"), 3, {"seed": 23})]

EXERCISES = [
    Exercise("f_and_g", "03", Text("f와 g 연산자 (autograd Function)", "The f and g operators (autograd Functions)"),
             STUB_PAIR, (
        Text("열 병렬 레이어의 입력은 모든 랭크에 같고, 행 병렬 레이어의 출력은 랭크마다 부분합입니다.",
             "The column layer's input is the same on every rank; the row layer's output is a partial sum on each rank."),
        Text("f: `y = x`, `dL/dx = Σ_r dL/dx_r`.  g: `y = Σ_r x_r`, `dL/dx_r = dL/dy`. 서로 켤레(conjugate)입니다.",
             "f: y = x, dL/dx = Σ_rank dL/dx_rank.  g: y = Σ_rank x_rank, dL/dx_rank = dL/dy. They are conjugates."),
        Text("f.forward: return x.view_as(x);  f.backward: g = grad.clone(); dist.all_reduce(g); return g\n"
             "g.forward: out = x.clone(); dist.all_reduce(out); return out;  g.backward: return grad",
             "f.forward: return x.view_as(x);  f.backward: g = grad.clone(); dist.all_reduce(g); return g\n"
             "g.forward: out = x.clone(); dist.all_reduce(out); return out;  g.backward: return grad")),
        CASES, _judge_with(_pair_body), uses="pair", target="(CopyToParallelRegion, ReduceFromParallelRegion)"),
    Exercise("megatron_mlp", "03", Text("all-reduce 한 번인 Megatron MLP", "A Megatron MLP with one all-reduce"), STUB_MLP, (
        Text("열 병렬 다음 행 병렬: 가운데 GeLU는 랭크마다 자기 특성에만 작용하니 통신이 필요 없습니다.",
             "Column then row: the GeLU in between acts on each rank's own features, so it needs no communication."),
        Text("z = g(gelu(f(x)·W1_rᵀ + b1_r)·W2_rᵀ) + b2. 편향 b2는 g 뒤에 한 번만.",
             "z = g(gelu(f(x)·W1_rᵀ + b1_r)·W2_rᵀ) + b2. The bias b2 once, after g."),
        Text("h = F.linear(f(x), up_weight, up_bias)\nreturn g(F.linear(F.gelu(h), down_weight)) + down_bias",
             "h = F.linear(f(x), up_weight, up_bias)\nreturn g(F.linear(F.gelu(h), down_weight)) + down_bias")),
        CASES, _judge_with(_mlp_body)),
]
