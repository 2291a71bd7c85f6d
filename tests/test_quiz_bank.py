"""Item bank loading, selection and lint: every bad input is reported as file:line item-id."""
import shutil
from pathlib import Path

import pytest

from mpkit.quiz import lint, load_bank
from mpkit.quiz.bank import TOPICS, BankError, resolve_bank_dir

GOOD = Path(__file__).parent / "fixtures" / "quiz" / "good"
REPO_BANK = Path(__file__).resolve().parent.parent / "quizzes"


@pytest.fixture
def bank_dir(tmp_path):
    return Path(shutil.copytree(GOOD, tmp_path / "bank"))


def edit(path, old, new):
    text = path.read_text(encoding="utf-8")
    assert old in text, f"fixture changed: {old!r} not in {path.name}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_good_bank_loads_in_topic_order_with_lines():
    bank = load_bank(GOOD)
    assert list(bank.items) == ["mp-001", "mp-002", "mp-003", "mp-004", "pp-001", "pp-002"]
    item = bank.items["mp-002"]
    assert (item.topic, item.answer, item.pitfall, item.difficulty, item.line) == \
        ("model_parallel", "X", "confuses-dp-with-mp", 1, 11)
    assert item.corrected["en"].startswith("Model parallelism splits the model")
    assert bank.items["mp-001"].corrected is None
    assert bank.items["mp-003"].lab == "03_model_parallel"
    assert bank.titles["pipeline"] == {"ko": "파이프라인 병렬화", "en": "Pipeline parallelism"}
    assert bank.pitfalls["bubble-formula"]["en"] == "Pipeline bubble formula"


def test_select_topic_all_ids_n_and_seeded_shuffle():
    bank = load_bank(GOOD)
    assert [i.id for i in bank.select("pipeline")] == ["pp-001", "pp-002"]
    assert len(bank.select("all")) == 6
    assert [i.id for i in bank.select(["pp-002", "mp-001"])] == ["pp-002", "mp-001"]
    assert [i.id for i in bank.select("model_parallel", n=2)] == ["mp-001", "mp-002"]
    first = [i.id for i in bank.select("all", shuffle=True, seed=3)]
    assert first == [i.id for i in bank.select("all", shuffle=True, seed=3)]
    assert sorted(first) == sorted(bank.items) and first != list(bank.items)


@pytest.mark.parametrize("arg, message", [
    ("pipelines", "unknown topic 'pipelines'; pass one of: model_parallel, pipeline, 'all'"),
    ("memory", "topic 'memory' has no item file"),
    (["pp-001", "zz-9", "qq-1"], "unknown item ids: zz-9, qq-1"),
    (["pp-001", "pp-001"], "listed more than once: pp-001"),
    ([], "non-empty list of item ids"),
])
def test_select_rejects_unknown_topics_and_ids(arg, message):
    with pytest.raises(ValueError) as err:
        load_bank(GOOD).select(arg)
    assert message in str(err.value)


@pytest.mark.parametrize("n", [0, 7, -1, True, 2.0])
def test_select_rejects_bad_n(n):
    with pytest.raises(ValueError, match="n must be a whole number from 1 to 6"):
        load_bank(GOOD).select("all", n=n)


MP = "model_parallel.yaml"
BAD_INPUTS = {
    "malformed yaml": (MP, '    source: "seed: 특징"', '    source: "seed: 특징\n    lab: [unclosed',
                       None, "not valid YAML"),
    "missing language": (MP, ', en: "Model parallelism trains with the model\'s parameters split across devices."}',
                         "}", (5, "mp-001"), "statement.en is missing"),
    "empty language": (MP, '{ko: "장치 사이에 활성값과 그래디언트를 주고받아야 한다."', '{ko: "  "',
                       (30, "mp-004"), "explanation.ko is empty"),
    "answer yes (YAML boolean)": (MP, "    answer: O\n", "    answer: yes\n", (6, "mp-001"),
                                  "answer must be the capital letter O (true) or X (false); got True"),
    "answer lowercase": (MP, "    answer: O\n", "    answer: o\n", (6, "mp-001"), "got 'o'"),
    "duplicate id": (MP, "id: mp-002", "id: mp-001", (11, "mp-001"), "duplicate id (first defined at"),
    "unknown pitfall": (MP, "pitfall: split-criterion", "pitfall: nope", (23, "mp-003"),
                        "unknown pitfall 'nope'; define it in pitfalls.yaml"),
    "unknown topic": (MP, "topic: model_parallel", "topic: modelparallel", (1, None), "topic must be one of"),
    "topic not matching file": (MP, "topic: model_parallel", "topic: pipeline", (1, None),
                                "name the file pipeline.yaml"),
    "difficulty out of range": (MP, "    difficulty: 1\n", "    difficulty: 4\n", (9, "mp-001"),
                                "difficulty must be 1, 2 or 3; got 4"),
    "X without corrected": (MP, '    corrected: {ko: "모델 병렬화는 모델을', '    note: {ko: "모델 병렬화는 모델을',
                            (11, "mp-002"), "answer X needs `corrected"),
    "missing field": (MP, '    source: "seed: 특징"\n', "", (27, "mp-004"), "missing required field 'source'"),
    "key written twice": (MP, "    answer: O\n", "    answer: O\n    answer: X\n", (7, "mp-001"),
                          "key 'answer' appears twice (first on line 6)"),
    "bad id": (MP, "id: mp-003", "id: mp 003", (19, "(item 3)"), "id must be text of letters"),
    "pitfall a list": (MP, "pitfall: split-criterion", "pitfall: [split-criterion]", (23, "mp-003"),
                       "pitfall must be one tag from pitfalls.yaml"),
}


@pytest.mark.parametrize("case", BAD_INPUTS, ids=list(BAD_INPUTS))
def test_each_bad_input_is_an_error_naming_file_line_and_id(bank_dir, case):
    name, old, new, where, message = BAD_INPUTS[case]
    edit(bank_dir / name, old, new)
    report = lint(bank_dir)
    matching = [p for p in report.errors if message in p.message]
    assert matching, report.format()
    problem = matching[0]
    assert problem.file == bank_dir / name
    if where is None:  # YAML syntax errors: the parser's line, somewhere after the edit
        assert problem.line is not None and problem.line >= 34
    else:
        assert (problem.line, problem.item_id) == where
        assert str(problem).startswith(f"{bank_dir / name}:{where[0]}{' ' + where[1] if where[1] else ''}: ")
    with pytest.raises(BankError) as err:  # the notebook-side loader refuses the same bank
        load_bank(bank_dir)
    assert message in str(err.value)


def test_missing_pitfalls_file_is_an_error(bank_dir):
    (bank_dir / "pitfalls.yaml").unlink()
    errors = lint(bank_dir).errors
    assert [str(e) for e in errors] == [f"{bank_dir / 'pitfalls.yaml'}: missing: the bank needs pitfalls.yaml "
                                        "with `pitfalls: {tag: {ko: ..., en: ...}}`"]


def test_duplicate_statement_is_a_lint_error_but_loads(bank_dir):
    edit(bank_dir / MP, '{ko: "모델 병렬화는 통신 오버헤드가 전혀 없다."',
         '{ko: "  모델 병렬화는 모델의 파라미터를   여러 장치로 나누어 학습한다. "')
    errors = lint(bank_dir).errors
    assert len(errors) == 1
    assert errors[0].item_id == "mp-004" and errors[0].line == 27
    assert "statement.ko duplicates mp-001" in errors[0].message
    assert "mp-004" in load_bank(bank_dir).items


def test_balance_warning_and_report(bank_dir):
    path = bank_dir / MP
    path.write_text(path.read_text(encoding="utf-8").replace("answer: X", "answer: O"), encoding="utf-8")
    report = lint(bank_dir)
    assert report.ok and report.balance["model_parallel"] == (4, 0)
    unbalanced = [w for w in report.warnings if "O/X balance" in w.message]
    assert [w.file for w in unbalanced] == [path]
    assert sum("corrected is ignored for O items" in w.message for w in report.warnings) == 2
    text = report.format()
    assert "model_parallel       4    4    0     100%  <- unbalanced" in text
    assert "pipeline             2    1    1      50%" in text
    assert load_bank(bank_dir).items["mp-002"].corrected is None


def test_report_of_a_topic_whose_every_item_has_errors(bank_dir):
    path = bank_dir / "pipeline.yaml"
    path.write_text(path.read_text(encoding="utf-8").replace("    answer: ", "    answer: maybe-"),
                    encoding="utf-8")
    report = lint(bank_dir)
    assert report.balance["pipeline"] == (0, 0) and not report.ok
    assert "pipeline             0    0    0        -" in report.format()


def test_bank_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("MPKIT_QUIZ_DIR", raising=False)
    assert resolve_bank_dir() == REPO_BANK
    monkeypatch.setenv("MPKIT_QUIZ_DIR", str(GOOD))
    assert resolve_bank_dir() == GOOD and "pp-001" in load_bank().items
    assert resolve_bank_dir(tmp_path) == tmp_path
    with pytest.raises(FileNotFoundError, match="set MPKIT_QUIZ_DIR"):
        load_bank(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no topic files"):
        load_bank(tmp_path)


def test_a_file_given_as_the_bank_folder_is_called_a_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"pitfalls.yaml is a file, not a folder; give the folder"):
        load_bank(GOOD / "pitfalls.yaml")
    with pytest.raises(FileNotFoundError, match=r"nowhere does not exist; give the folder"):
        lint(tmp_path / "nowhere")


@pytest.mark.skipif(not any(REPO_BANK.glob("*.yaml")), reason="the real item bank has not landed yet")
def test_real_bank_lints_clean():
    report = lint(REPO_BANK)
    assert report.ok, report.format()
    bank = load_bank(REPO_BANK)
    assert set(bank.topics) <= set(TOPICS) and len(bank.items) > 0
    prefixes = {}
    for item in bank.items.values():  # "stable, unique across the bank, prefix per topic"
        prefixes.setdefault(item.topic, set()).add(item.id.rsplit("-", 1)[0])
    assert all(len(p) == 1 for p in prefixes.values()), prefixes
    assert len({p.pop() for p in prefixes.values()}) == len(prefixes), "two topics share an id prefix"
