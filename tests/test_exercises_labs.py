"""The labs carry the exercises: every exercise sits in the lab that teaches it, as a stub (no
solution in the notebook), a check cell and a hint panel; with the reference solutions filled in,
every lab's exercise cells run and every check passes. (The labs as shipped, stubs untouched, run
under nbval: each check says "not done yet".)"""
from pathlib import Path

import nbformat
import pytest

from mpkit.exercises import EXERCISES, solutions

LABS = sorted((Path(__file__).resolve().parents[1] / "labs").glob("*.ipynb"))


def exercise_cells(path):
    return [c for c in nbformat.read(path, as_version=4).cells if "exercise" in c.metadata.get("mpkit", {})]


def test_every_exercise_is_in_the_lab_that_teaches_it_without_its_solution():
    found = {}
    for path in LABS:
        for cell in exercise_cells(path):
            name = cell.metadata["mpkit"]["exercise"]
            found.setdefault(name, set()).add(path.name[:2])
            if cell.metadata["mpkit"].get("role") == "stub":
                assert cell.source.strip() == EXERCISES[name].stub.strip(), f"{path.name}: {name}'s stub differs"
                for obj in solutions.definitions(EXERCISES[name]):
                    assert solutions.body(obj).strip()[:60] not in cell.source, f"{path.name}: {name}'s solution"
    assert found == {name: {ex.lab} for name, ex in EXERCISES.items()}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", [p for p in LABS if exercise_cells(p)], ids=lambda p: p.name)
def test_lab_exercises_pass_with_the_reference_solutions(path, tmp_path, monkeypatch):
    monkeypatch.setenv("MPKIT_RESULTS_DIR", str(tmp_path))
    nb = nbformat.read(path, as_version=4)
    setup = [c.source for c in nb.cells if c.cell_type == "code" and "from mpkit import exercises" in c.source]
    namespace = {"LANG": "en"}
    exec(compile("\n".join(setup), f"{path.name}-setup", "exec"), namespace)
    results = {}
    for cell in exercise_cells(path):
        name, role = cell.metadata["mpkit"]["exercise"], cell.metadata["mpkit"].get("role")
        if role == "stub":
            exec(compile(solutions.source(EXERCISES[name]), f"{name}-solution", "exec"), namespace)
        elif role == "check":
            results[name] = eval(cell.source, namespace)
        elif role == "panel":
            assert eval(cell.source.split("#")[0], namespace).children, name
    assert results and all(r.passed for r in results.values()), {n: r.message for n, r in results.items() if not r.passed}


def test_readme_lists_every_exercise_under_its_lab():
    """The instructor section's table is what `mpkit exercise list` prints, lab by lab."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    rows = {}
    for line in readme.split("| lab | exercises (`mpkit exercise list`) |")[1].split("\n\n")[0].splitlines()[2:]:
        lab, names = line.strip("|").split("|")[:2]
        rows[lab.strip()] = [n.strip(" `") for n in names.split(",")]
    listed = {lab: names for lab, names in rows.items() if lab.isdigit()}
    assert listed == {lab: [e.name for e in EXERCISES.values() if e.lab == lab]
                      for lab in sorted({e.lab for e in EXERCISES.values()})}
    assert "13 (capstone)" in rows
