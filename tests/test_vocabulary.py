"""One definition of each vocabulary (issue 42): the schedule and recomputation names live in
``mpkit.vocabulary`` only; every other module imports them, so the run, the formulas and the
planner cannot drift apart (``RECOMPUTE`` was once defined three times, one with None for "none")."""
import ast
from pathlib import Path

import pytest

from mpkit import vocabulary
from mpkit.config import build_config
from mpkit.parallel.pipeline.schedules import ORDERS
from mpkit.simulator import formulas

PACKAGE = Path(__file__).resolve().parents[1] / "mpkit"
NAMES = {"SCHEDULES", "CLOSED_FORM_SCHEDULES", "RECOMPUTE"}


def assigned_names(path: Path) -> set:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {target.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)}


def test_the_vocabularies_are_defined_in_one_module():
    where = sorted(f"{path.relative_to(PACKAGE.parent)}: {name}" for path in PACKAGE.rglob("*.py")
                   for name in assigned_names(path) & NAMES)
    assert where == [f"mpkit/vocabulary.py: {name}" for name in sorted(NAMES)]


def test_every_schedule_name_has_its_order_and_the_closed_forms_are_among_them():
    assert tuple(ORDERS) == vocabulary.SCHEDULES
    assert set(vocabulary.CLOSED_FORM_SCHEDULES) < set(vocabulary.SCHEDULES)


def test_a_run_takes_none_as_the_planners_none_and_refuses_the_planner_only_mode():
    def config(recompute):
        return build_config("single", 1, {}, {}, recompute=recompute)
    assert config("none").recompute is None and config(None).recompute is None
    assert config("full").recompute == "full"
    with pytest.raises(ValueError, match="recompute='op' is priced by mpkit.sim.plan only; use 'full'"):
        config("op")


def test_the_formulas_say_which_names_they_have_no_closed_form_for():
    with pytest.raises(ValueError, match="schedule='zbv' has no closed form .*; use one of gpipe, 1f1b, interleaved"):
        formulas.bubble_fraction(4, 8, schedule="zbv")
    with pytest.raises(ValueError, match="schedule='zigzag' is unknown; use one of gpipe"):
        formulas.bubble_fraction(4, 8, schedule="zigzag")
    with pytest.raises(ValueError, match="recompute='op' has no per-layer formula"):
        formulas.activation_memory_per_layer(2048, 1, 4096, 32, recompute="op")
