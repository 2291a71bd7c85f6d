"""Content checks for the O/X item bank in ``quizzes/`` (data, not the quiz engine).

Plain pytest + PyYAML on purpose: this must not import ``mpkit.quiz``, so the bank can be
checked on its own. What is checked here is what the engine's loader does not know about:
coverage of the seed note, O/X balance per topic, and the arithmetic of numeric items.

Optional item field ``check`` (for numeric items): ``{formula: NAME, <inputs>..., claimed: NUMBER,
tol: REL_TOL}`` (``tol`` optional, default 0.02 relative). The test recomputes NAME(inputs) and
requires "claimed agrees with the formula" to be exactly "answer is O". Formulas and units are
in ``FORMULAS`` below.
"""
import glob
import math
import os
import re
import unicodedata

import pytest
import yaml

BANK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "quizzes")

TOPIC_PREFIX = {
    "overview": "ov", "data_parallel": "dp", "model_parallel": "mp", "tensor_parallel": "tp",
    "pipeline": "pp", "communication": "comm", "memory": "mem", "libraries": "lib", "combining": "comb",
    "long_sequence": "ls", "faults": "ft",
}
REQUIRED = {"id", "statement", "answer", "explanation", "pitfall", "difficulty", "source"}
OPTIONAL = {"corrected", "lab", "check"}
LABS = {"00_start_here", "01_data_parallel", "02_model_parallel", "03_tensor_parallel",
        "04_pipeline_parallel", "05_communication", "06_memory_sharding", "07_pytorch_api",
        "08_tensorflow_api", "09_exam_review", "11_long_sequences", "12_when_ranks_fail"}
SEED_SECTIONS = ("정의", "특징", "적합한 경우", "시험 함정", "패턴 보기",
                 "추가 학습 내용 1", "추가 학습 내용 2", "추가 학습 내용 3")
PATTERN_O = "모델 병렬화는 모델의 파라미터를 여러 장치로 나누어 학습한다."
PATTERN_X = "모델 병렬화는 데이터를 여러 장치로 나누어 병렬로 처리한다."

# Every line of the seed note -> (an O item, an X item) that drills it. Both must be sourced
# from the seed section the line belongs to.
SEED_CLAIMS = {
    "정의: parameters distributed over GPUs/TPUs": ("정의", "ov-003", "ov-004"),
    "특징: complex, depends on model structure": ("특징", "ov-007", "ov-008"),
    "특징: splits the model, not the data": ("특징", "ov-005", "ov-006"),
    "특징: less GPU memory, large models possible": ("특징", "ov-022", "ov-021"),
    "특징: communication overhead, optimisation matters": ("특징", "ov-024", "ov-023"),
    "적합한 경우: model does not fit one GPU": ("적합한 경우", "ov-009", "ov-010"),
    "적합한 경우: GPT-3/BERT-scale training or inference": ("적합한 경우", "ov-011", "ov-012"),
    "시험 함정: confusing with data parallelism": ("시험 함정", "ov-018", "dp-012"),
    "시험 함정: split criterion (layer vs parameter)": ("시험 함정", "ov-020", "ov-019"),
    "패턴 보기: the two pattern statements": ("패턴 보기", "ov-001", "ov-002"),
    "추가 1: data parallelism = replicas on different samples": ("추가 학습 내용 1", "ov-013", "ov-014"),
    "추가 1: DP when data large / model small": ("추가 학습 내용 1", "ov-015", "ov-025"),
    "추가 1: MP example, layer on GPU1, next on GPU2": ("추가 학습 내용 1", "ov-017", "ov-016"),
    "추가 2: overhead from transfers, slow links hurt": ("추가 학습 내용 2", "mp-015", "mp-016"),
    "추가 2: transfer cost model / message count": ("추가 학습 내용 2", "comm-001", "comm-002"),
    "추가 2: pipeline parallelism": ("추가 학습 내용 2", "pp-001", "pp-002"),
    "추가 2: pipeline minimises communication": ("추가 학습 내용 2", "pp-020", "pp-019"),
    "추가 2: asynchronous communication": ("추가 학습 내용 2", "comm-009", "comm-010"),
    "추가 2: communication optimisation / gradient reduction": ("추가 학습 내용 2", "comm-016", "comm-017"),
    "추가 3: torch.distributed does DP and MP": ("추가 학습 내용 3", "lib-001", "lib-002"),
    "추가 3: DistributedDataParallel is DP": ("추가 학습 내용 3", "lib-003", "lib-004"),
    "추가 3: torch.distributed.rpc for MP": ("추가 학습 내용 3", "lib-005", "lib-006"),
    "추가 3: init_process_group initialises": ("추가 학습 내용 3", "lib-007", "lib-008"),
    "추가 3: tf.distribute.Strategy": ("추가 학습 내용 3", "lib-012", "lib-013"),
    "추가 3: MirroredStrategy is DP": ("추가 학습 내용 3", "lib-014", "lib-015"),
    "추가 3: TPUStrategy needs TPUs": ("추가 학습 내용 3", "lib-016", "lib-017"),
    "추가 3: ParameterServerStrategy": ("추가 학습 내용 3", "lib-018", "lib-019"),
    "추가 3: how the libraries are used": ("추가 학습 내용 3", "lib-021", "lib-022"),
}


def _zero_gb(stage, psi_billion, n):
    psi = psi_billion  # GB per byte-per-parameter
    return {1: 4 * psi + 12 * psi / n, 2: 2 * psi + 14 * psi / n, 3: 16 * psi / n}[stage]


FORMULAS = {
    # share of step time idle, GPipe and 1F1B (Huang et al. 2019; Narayanan et al. 2021)
    "bubble": lambda p, m: (p - 1) / (m + p - 1),
    # bubble time / ideal compute time, interleaved 1F1B with v chunks per device
    "bubble_interleaved": lambda p, m, v: (p - 1) / (v * m),
    # micro-batches of activations alive on stage 0
    "inflight_1f1b": lambda p, m: min(p, m),
    "inflight_gpipe": lambda p, m: m,
    # bytes sent per rank, same unit as size
    "ring_allreduce": lambda n, size: 2 * (n - 1) / n * size,
    "reduce_scatter": lambda n, size: (n - 1) / n * size,
    "all_gather": lambda n, size: (n - 1) / n * size,
    # nccl-tests bus bandwidth, same unit as algbw
    "busbw": lambda n, algbw: algbw * 2 * (n - 1) / n,
    # 3D parallelism: the grid dp x tp x pp is the world; ZeRO-1 over dp, mixed-precision Adam, GB
    "dp_size": lambda gpus, tp, pp: gpus / (tp * pp),
    "world_size_3d": lambda dp, tp, pp: dp * tp * pp,
    "model_state_3d_gb": lambda psi_billion, tp, pp, dp: 4 * psi_billion / (tp * pp) + 12 * psi_billion / (tp * pp * dp),
    # model state of mixed-precision Adam in GB (1e9 bytes), psi in billions of parameters
    "adam_mixed_gb": lambda psi_billion: 16 * psi_billion,
    "zero_gb": _zero_gb,
    # activation memory per transformer layer in MB (1e6 bytes), Korthikanti et al. 2022
    "activation_mb": lambda s, b, h, a: s * b * h * (34 + 5 * a * s / h) / 1e6,
    "activation_tp_mb": lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) / 1e6,
    # Young's (1974) checkpoint interval sqrt(2·delta·M) in minutes: save time in seconds, MTBF in hours
    "young_minutes": lambda save_s, mtbf_h: math.sqrt(2 * save_s * mtbf_h * 3600) / 60,
    # one layer-boundary activation tensor in MiB
    "boundary_activation_mib": lambda b, s, h, bytes_per_element: b * s * h * bytes_per_element / 2**20,
}


def _load(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _topic_files():
    return sorted(f for f in glob.glob(os.path.join(BANK, "*.yaml"))
                  if os.path.basename(f) not in ("pitfalls.yaml", "glossary.yaml"))


@pytest.fixture(scope="module")
def topics():
    return {os.path.splitext(os.path.basename(f))[0]: _load(f) for f in _topic_files()}


@pytest.fixture(scope="module")
def items(topics):
    return [(name, it) for name, doc in topics.items() for it in doc["items"]]


@pytest.fixture(scope="module")
def by_id(items):
    return {it["id"]: it for _, it in items}


@pytest.fixture(scope="module")
def pitfalls():
    return _load(os.path.join(BANK, "pitfalls.yaml"))["pitfalls"]


def _norm(text):
    return re.sub(r"\s+", " ", unicodedata.normalize("NFC", text)).strip().rstrip(".").lower()


def _hangul(text):
    return re.search(r"[\uac00-\ud7a3]", text) is not None


def _bilingual_ok(value):
    return (isinstance(value, dict) and set(value) == {"ko", "en"}
            and all(isinstance(v, str) and v.strip() for v in value.values())
            and _hangul(value["ko"]) and not _hangul(value["en"]))


def test_every_file_loads_and_every_topic_is_present():
    files = _topic_files()
    names = {os.path.splitext(os.path.basename(f))[0] for f in files}
    assert names == set(TOPIC_PREFIX), names ^ set(TOPIC_PREFIX)
    for f in files + [os.path.join(BANK, "pitfalls.yaml")]:
        assert _load(f), f


def test_topic_headers(topics):
    for name, doc in topics.items():
        assert set(doc) == {"topic", "title", "items"}, name
        assert doc["topic"] == name
        assert _bilingual_ok(doc["title"]), name
        assert isinstance(doc["items"], list) and doc["items"], name


def test_bank_size_and_balance(topics, items):
    assert len(items) >= 130
    for name, doc in topics.items():
        n = len(doc["items"])
        o = sum(it["answer"] == "O" for it in doc["items"])
        assert n >= 12, f"{name}: only {n} items"
        assert 0.40 <= o / n <= 0.60, f"{name}: O share {o}/{n} = {o / n:.0%}"


def test_item_fields(items):
    for topic, it in items:
        iid = it.get("id")
        keys = set(it)
        assert REQUIRED <= keys, f"{iid}: missing {REQUIRED - keys}"
        assert keys <= REQUIRED | OPTIONAL, f"{iid}: unknown {keys - REQUIRED - OPTIONAL}"
        assert re.fullmatch(rf"{TOPIC_PREFIX[topic]}-\d{{3}}", iid), f"{iid} in {topic}"
        assert it["answer"] in ("O", "X"), iid
        assert it["difficulty"] in (1, 2, 3), iid
        assert _bilingual_ok(it["statement"]), iid
        assert _bilingual_ok(it["explanation"]), iid
        assert isinstance(it["source"], str) and it["source"].strip(), iid
        if "lab" in it:
            assert it["lab"] in LABS, f"{iid}: unknown lab {it['lab']!r}"


def test_ids_unique(items):
    ids = [it["id"] for _, it in items]
    dupes = {i for i in ids if ids.count(i) > 1}
    assert not dupes, dupes


def test_x_items_have_corrected_and_o_items_do_not(items):
    for _, it in items:
        if it["answer"] == "X":
            assert _bilingual_ok(it.get("corrected")), f"{it['id']}: corrected ko/en required"
            for lang in ("ko", "en"):
                assert _norm(it["corrected"][lang]) != _norm(it["statement"][lang]), it["id"]
        else:
            assert "corrected" not in it, f"{it['id']}: O items take no corrected"


def test_no_duplicate_statements(items):
    for lang in ("ko", "en"):
        seen = {}
        for _, it in items:
            key = _norm(it["statement"][lang])
            assert key not in seen, f"{it['id']} repeats {seen[key]} ({lang})"
            seen[key] = it["id"]


def test_pitfalls_defined_and_used(items, pitfalls):
    # a small taxonomy a student can read in one table; lab 11 (long sequences, experts) added two kinds of
    # mistake of its own, content round 3 one (compute estimates), round 4 one (data parallelism at scale),
    # lab 12 (failures, checkpoints) two
    assert 12 <= len(pitfalls) <= 25
    for tag, names in pitfalls.items():
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", tag), tag
        assert _bilingual_ok(names), tag
    used = {it["pitfall"] for _, it in items}
    assert used <= set(pitfalls), f"undefined: {used - set(pitfalls)}"
    assert set(pitfalls) <= used, f"never used: {set(pitfalls) - used}"
    assert {"confuses-dp-with-mp", "split-criterion"} <= used  # the seed's own 시험 함정


def test_seed_sources_are_well_formed(items):
    for _, it in items:
        src = it["source"]
        if src.startswith("seed"):
            assert src.startswith("seed: ") and src[len("seed: "):] in SEED_SECTIONS, \
                f"{it['id']}: bad seed source {src!r}"


@pytest.mark.parametrize("section", SEED_SECTIONS)
def test_every_seed_section_has_o_and_x(items, section):
    answers = {it["answer"] for _, it in items if it["source"] == f"seed: {section}"}
    assert answers == {"O", "X"}, f"seed: {section} has {answers or 'no items'}"


@pytest.mark.parametrize("claim", sorted(SEED_CLAIMS))
def test_every_seed_claim_has_o_and_x(by_id, claim):
    section, o_id, x_id = SEED_CLAIMS[claim]
    for iid, answer in ((o_id, "O"), (x_id, "X")):
        assert iid in by_id, f"{claim}: {iid} missing"
        assert by_id[iid]["answer"] == answer, f"{claim}: {iid} should be {answer}"
        assert by_id[iid]["source"] == f"seed: {section}", f"{claim}: {iid} source"


def test_seed_pattern_statements_verbatim(items):
    ko = {_norm(it["statement"]["ko"]): it["answer"] for _, it in items}
    assert ko.get(_norm(PATTERN_O)) == "O"
    assert ko.get(_norm(PATTERN_X)) == "X"


def _checked(items):
    return [it for _, it in items if "check" in it]


def test_numeric_items_agree_with_formulas(items):
    checked = _checked(items)
    assert len(checked) >= 10
    for it in checked:
        spec = dict(it["check"])
        name = spec.pop("formula")
        claimed = spec.pop("claimed")
        tol = spec.pop("tol", 0.02)
        assert name in FORMULAS, f"{it['id']}: unknown formula {name!r}"
        value = FORMULAS[name](**spec)
        agrees = math.isclose(value, claimed, rel_tol=tol)
        assert agrees == (it["answer"] == "O"), \
            f"{it['id']}: {name}({spec}) = {value:.6g}, claimed {claimed}, answer {it['answer']}"


def test_numeric_items_cover_design_numbers(items):
    formulas = {it["check"]["formula"] for it in _checked(items)}
    assert {"bubble", "ring_allreduce", "zero_gb", "adam_mixed_gb", "activation_mb"} <= formulas
    both = {}
    for it in _checked(items):
        both.setdefault(it["check"]["formula"], set()).add(it["answer"])
    for name in ("bubble", "ring_allreduce", "zero_gb", "adam_mixed_gb"):
        assert both[name] == {"O", "X"}, f"{name} needs an O and an X numeric item"


def test_reference_values():
    # the headline numbers the labs quote, recomputed
    assert FORMULAS["bubble"](4, 4) == pytest.approx(3 / 7)
    assert FORMULAS["ring_allreduce"](4, 100) == pytest.approx(150)
    assert FORMULAS["adam_mixed_gb"](1) == 16
    assert FORMULAS["zero_gb"](3, 1, 8) == pytest.approx(2)
    assert FORMULAS["zero_gb"](1, 7.5, 64) == pytest.approx(31.40625)
    assert FORMULAS["zero_gb"](2, 7.5, 64) == pytest.approx(16.640625)
    assert FORMULAS["activation_mb"](2048, 1, 4096, 32) == pytest.approx(956.301312)
    assert FORMULAS["boundary_activation_mib"](8, 2048, 4096, 2) == 128
    assert FORMULAS["dp_size"](64, 8, 4) == 2 and FORMULAS["world_size_3d"](4, 4, 4) == 64
    assert FORMULAS["model_state_3d_gb"](175, 8, 8, 16) == pytest.approx(12.988, abs=1e-3)


def test_live_run_items(items):
    live = [it for _, it in items if "lab" in it]
    assert 10 <= len(live) <= 20
    assert {it["answer"] for it in live} == {"O", "X"}


def test_no_item_points_at_a_plot_above(items):
    # every item is also drawn outside its lab (lab 09's exam, quiz sheet, quiz assign), where
    # "the plot above" means nothing: items state what the lab shows (quiz lint checks this too)
    for _, it in items:
        for field in ("statement", "explanation", "corrected"):
            if field in it:
                assert not re.search(r"(?<![가-힣])위(의)? ", it[field]["ko"]), (it["id"], field)
                assert not re.search(r"\babove\b", it[field]["en"], re.I), (it["id"], field)
