"""Reference code a learner can read (issue 42): the closed-form cost model prices one dimension
per function, none longer than a screenful and a half, and every pipeline schedule is one function
of ``schedules.py``."""
import ast
from pathlib import Path

from mpkit.parallel.pipeline import schedules
from mpkit.vocabulary import SCHEDULES

PACKAGE = Path(__file__).resolve().parents[1] / "mpkit"
LONGEST = 80  # lines


def long_functions(path: Path, longest: int = LONGEST) -> list:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return sorted(f"{node.name}: {node.end_lineno - node.lineno + 1} lines" for node in ast.walk(tree)
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.end_lineno - node.lineno + 1 > longest)


def test_no_function_of_the_analytic_cost_model_is_over_80_lines():
    assert long_functions(PACKAGE / "costmodel" / "analytic.py") == []


def test_the_length_check_can_fail(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n")
    assert long_functions(tmp_path / "long.py") == [f"long: {LONGEST + 1} lines"]


def test_the_dimensions_are_priced_by_their_own_functions():
    tree = ast.parse((PACKAGE / "costmodel" / "analytic.py").read_text(encoding="utf-8"))
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert {"_layer_compute", "_tensor_parallel", "_context_parallel", "_expert_parallel", "_logits", "_pipeline",
            "_data_parallel", "_memory"} <= defined


def test_every_schedule_is_one_function_that_opens_with_its_algorithm():
    for name in SCHEDULES:
        function = schedules.ORDERS[name]
        assert function.__module__ == schedules.__name__ and function.__doc__, name


def test_the_results_page_and_the_benchmark_folder_stay_small():
    """Issue 42: BENCHMARKS.md is a results page a reader takes in in five minutes (its history is in
    git), and benchmarks/ holds at most 12 scripts at its top level (the rest in _common/ and probes/)."""
    root = Path(__file__).resolve().parents[1]
    assert len((root / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()) <= 400
    assert len(list((root / "benchmarks").glob("*.py"))) <= 12
