"""One vocabulary (quizzes/glossary.yaml) for labs, items and widgets.

The checks themselves (mpkit.quiz.glossary), lint's glossary warnings and its "the plot above"
error on a bank, and the same vocabulary in every lab's markdown and in the Korean strings of
mpkit.i18n, with the English term in parentheses at a Korean term's first use in each lab.
"""
import ast
import json
import re
import shutil
from pathlib import Path

import pytest

from mpkit.i18n import STRINGS
from mpkit.quiz import glossary, lint

REPO = Path(__file__).resolve().parents[1]
GLOSSARY = REPO / "quizzes" / glossary.GLOSSARY_FILE
GOOD = Path(__file__).parent / "fixtures" / "quiz" / "good"
LABS = sorted((REPO / "labs").glob("*.ipynb"))
TERMS = glossary.load(GLOSSARY)


def markdown(path):
    """(Korean text, English text) of a notebook's markdown cells, paragraph by paragraph: a
    paragraph is English if it starts with the ``**EN**`` marker or holds no Hangul."""
    ko, en = [], []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            for paragraph in re.split(r"\n\s*\n", "".join(cell["source"])):
                english = paragraph.lstrip().startswith("**EN**") or not glossary.HANGUL.search(paragraph)
                (en if english else ko).append(paragraph)
    return "\n\n".join(ko), "\n\n".join(en)


# ---- the checks ----

def test_glossary_loads_with_one_entry_per_term():
    kos = [term.ko for term in TERMS]
    ens = [term.en for term in TERMS]
    assert len(set(kos)) == len(kos) and len(set(ens)) == len(ens)
    assert {"활성값", "랭크", "스테이지", "레이어", "시뮬레이션 장치", "all-reduce", "통신 최적화"} <= set(kos)


@pytest.mark.parametrize("text,lang,found", [
    ("활성화 메모리가 크다", "ko", ["활성화"]),
    ("활성화 함수는 GeLU이다", "ko", []),                                # activation function: a different word
    ("올리듀스 한 번, 올개더 한 번", "ko", ["올리듀스", "올개더"]),
    ("각 rank가 계산한다", "ko", ["rank"]),
    ("`ctx.rank`와 get_rank(), LOCAL_RANK", "ko", []),                # code and identifiers
    ('시드의 "통신 합성"은 오역이다', "ko", []),                           # a quoted seed term
    ("통신 합성으로 줄인다", "ko", ["통신 합성"]),
    ("층 0은 랭크 0에 있다, 계층 구조", "ko", ["층"]),
    ("rank 0's rendezvous / rank 0의 주소", "ko", ["rank"]),           # only the Korean half
    ("each rank sends a microbatch", "en", ["microbatch"]),
    ("an allreduce per step", "en", ["allreduce"]),
])
def test_variants(text, lang, found):
    assert [v.found for v in glossary.variants(text, lang, TERMS)] == found


def test_first_use_needs_the_english_term_in_parentheses():
    terms = [t for t in TERMS if t.ko in ("활성값", "파라미터", "파라미터 서버")]
    assert glossary.missing_parentheses("활성값(activations)이 쌓이고, 활성값은 줄지 않는다.", terms) == []
    assert [t.ko for t in glossary.missing_parentheses("활성값이 쌓인다. 활성값(activation)", terms)] == ["활성값"]
    # a use inside a longer term counts for that term, headings and quotes do not count
    text = "## 파라미터와 활성값\n파라미터 서버(parameter server)에 **파라미터**(parameters)를 둔다."
    assert glossary.missing_parentheses(text, terms) == []
    assert [t.ko for t in glossary.missing_parentheses(text + " 활성값도.", terms)] == ["활성값"]


def test_a_broken_glossary_is_a_clear_error(tmp_path):
    bad = tmp_path / "glossary.yaml"
    bad.write_text("terms:\n  - {ko: 활성값, en: activation, avoid: {ko: ['(']}}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"term 1 \(활성값\): bad avoid.ko pattern"):
        glossary.load(bad)
    bad.write_text("terms: []\n", encoding="utf-8")
    with pytest.raises(ValueError, match="needs `terms:`"):
        glossary.load(bad)


# ---- quiz lint ----

@pytest.fixture
def bank(tmp_path):
    bank = Path(shutil.copytree(GOOD, tmp_path / "bank"))
    shutil.copy(GLOSSARY, bank / glossary.GLOSSARY_FILE)
    return bank


def edit(path, old, new):
    text = path.read_text(encoding="utf-8")
    assert old in text, f"fixture changed: {old!r} not in {path.name}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def vocabulary(report):
    """Lint's glossary warnings (the fixture bank also lacks most topic files: other warnings)."""
    return [str(w) for w in report.warnings if " uses " in w.message or "glossary" in w.message]


def test_lint_warns_on_a_variant_naming_file_line_item_and_the_term(bank):
    assert vocabulary(lint(bank)) == []
    path = bank / "model_parallel.yaml"
    edit(path, '{ko: "모델 병렬화는 통신 오버헤드가 전혀 없다."', '{ko: "모델 병렬화는 활성화 통신 오버헤드가 전혀 없다."')
    report = lint(bank)
    assert report.ok and vocabulary(report) == [
        f"{path}:27 mp-004: statement.ko uses '활성화': write 활성값 (activation)"]


def test_lint_without_a_glossary_says_so(bank):
    (bank / glossary.GLOSSARY_FILE).unlink()
    assert vocabulary(lint(bank)) == [f"{bank / 'glossary.yaml'}: no glossary in the bank: vocabulary not checked"]


def test_lint_reports_a_broken_glossary_as_an_error(bank):
    (bank / glossary.GLOSSARY_FILE).write_text("terms: nope\n", encoding="utf-8")
    errors = lint(bank).errors
    assert len(errors) == 1 and "needs `terms:`" in errors[0].message


@pytest.mark.parametrize("old,new,said", [
    ('{ko: "모델 병렬화는 통신 오버헤드가 전혀 없다."', '{ko: "위 타임라인에서 모델 병렬화는 통신 오버헤드가 전혀 없다."', "위 타임라인"),
    ('{ko: "모델 병렬화는 통신 오버헤드가 전혀 없다."', '{ko: "위의 메모리 그래프처럼 모델 병렬화는 통신 오버헤드가 전혀 없다."', "위의 메모리 그래프"),
])
def test_lint_errors_on_an_item_that_points_at_the_plot_above(bank, old, new, said):
    path = bank / "model_parallel.yaml"
    edit(path, old, new)
    edit(path, "    source: \"seed: 특징\"\n", "    source: \"seed: 특징\"\n    lab: 02_model_parallel\n")
    errors = lint(bank).errors
    assert len(errors) == 1 and errors[0].item_id == "mp-004" and errors[0].line == 27
    assert f"statement.ko says {said!r} (lab: 02_model_parallel), but items are also drawn outside their lab" \
        in errors[0].message


def test_lint_errors_on_above_in_english_too(bank):
    path = bank / "model_parallel.yaml"
    edit(path, 'en: "Model parallelism has no communication overhead at all."',
         'en: "As the plot above shows, model parallelism has no communication overhead at all."')
    errors = lint(bank).errors
    assert [(e.item_id, e.message.split(" says ")[0]) for e in errors] == [("mp-004", "statement.en")]


# ---- labs and widgets ----

@pytest.mark.parametrize("path", LABS, ids=lambda p: p.stem)
def test_lab_markdown_uses_the_glossary(path):
    ko, en = markdown(path)
    found = [str(v) for v in glossary.variants(ko, "ko", TERMS) + glossary.variants(en, "en", TERMS)]
    assert not found, f"{path.name}: " + "; ".join(found)


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.stem)
def test_lab_gives_the_english_term_at_first_use(path):
    ko, _ = markdown(path)
    missing = [f"{t.ko}({t.en})" for t in glossary.missing_parentheses(ko, TERMS)]
    assert not missing, f"{path.name}: first use without the English term in parentheses: {', '.join(missing)}"


@pytest.mark.parametrize("lang", ["ko", "en"])
def test_widget_and_plot_strings_use_the_glossary(lang):
    # {placeholders} are names for str.format, not words
    found = [f"{key}: {v}" for key, value in STRINGS.items()
             for v in glossary.variants(re.sub(r"\{[^}]*\}", " ", value[lang]), lang, TERMS)]
    assert not found, found


# ---- the documents and the package's own words ----

DOCS = ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md"]


@pytest.mark.parametrize("name", DOCS)
def test_documents_use_the_glossary(name):
    text = (REPO / name).read_text(encoding="utf-8")
    found = [str(v) for lang in ("ko", "en") for v in glossary.variants(text, lang, TERMS)]
    assert not found, f"{name}: " + "; ".join(found)


def test_docstrings_and_messages_use_the_glossary():
    """Every string in mpkit (docstrings, errors, strategy descriptions), ``code`` left out:
    'Megatron-LM 3-D' and '3-D parallelism' in the package's docstrings used to pass unseen. A string
    that is one identifier is code too (torch's method names, e.g. ProcessGroup.allreduce)."""
    found = []
    for path in sorted((REPO / "mpkit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and not node.value.isidentifier():
                text = re.sub(r"``[^`]*``", " ", node.value)
                found += [f"{path.relative_to(REPO)}:{node.lineno}: {v}" for v in glossary.variants(text, "en", TERMS)]
    assert not found, found


def test_3d_parallelism_has_one_spelling():
    en = [t for t in TERMS if t.en == "3D parallelism"]
    assert [v.found for v in glossary.variants("a 3-D run of Megatron-LM 3-D, 3D parallelism", "en", en)] == \
        ["3-D", "3-D"]
    assert sorted(v.found for v in glossary.variants("3-D 병렬화와 3차원 병렬", "ko", en)) == ["3-D 병렬", "3차원 병렬"]


# ---- the words of review round 2 (T4-T7) and of the topics it found untaught ----

def test_review_two_words_are_in_the_glossary():
    kos = {term.ko: term.en for term in TERMS}
    assert {"링 all-reduce": "ring all-reduce", "임계 경로": "critical path", "그래디언트 축소": "gradient reduction",
            "재계산": "recomputation", "선택적 재계산": "selective recomputation", "오프로드": "offload",
            "임베딩 그룹": "embedding group", "장치 메시": "device mesh", "프리페치": "prefetch",
            "모델 FLOPs 활용률": "model FLOPs utilization",
            "하드웨어 FLOPs 활용률": "hardware FLOPs utilization"}.items() <= kos.items()


@pytest.mark.parametrize("text,found", [
    ("ring all-reduce로 평균한다", ["ring all-reduce"]),
    ("랭크를 고리로 세운다", ["고리"]),
    ("링 알고리즘과 링 all-reduce", []),                          # 알고리즘 holds 고리: not a variant
    ("계산 경로 위에서 all-reduce한다", ["계산 경로"]),
    ("그래디언트 reduction을 한 번 한다", ["그래디언트 reduction"]),
    ("`ring all-reduce`는 코드", []),
])
def test_review_two_variants(text, found):
    assert [v.found for v in glossary.variants(text, "ko", TERMS)] == found


def test_selective_recomputation_is_its_own_first_use():
    terms = [t for t in TERMS if t.ko in ("재계산", "선택적 재계산")]
    assert glossary.missing_parentheses("선택적 재계산(selective recomputation)과 재계산(recomputation)", terms) == []
    assert [t.ko for t in glossary.missing_parentheses("선택적 재계산(selective recomputation)과 재계산", terms)] == ["재계산"]
