"""The labs use only the public API that ARCHITECTURE.md lists, and every name listed exists."""
import ast
import importlib
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def public_api() -> dict[str, set[str]]:
    """{module: names} from the "Public API" section of ARCHITECTURE.md."""
    section = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8").split("## Public API", 1)[1]
    api = {}
    for item in re.split(r"\n- ", "\n" + section)[1:]:
        modules = re.findall(r"`(mpkit[\w.]*)`", item.split(":", 1)[0])
        names = set(re.findall(r"`(\w+)`", item.split(":", 1)[1])) if ":" in item else set()
        for module in modules:
            api[module] = names
    return api


API = public_api()


def lab_imports():
    for path in sorted((REPO / "labs").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "\n".join(line for line in "".join(cell["source"]).splitlines() if not line.startswith(("%", "!")))
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mpkit"):
                    for alias in node.names:
                        yield path.name, node.module, alias.name
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.startswith("mpkit"):
                            yield path.name, alias.name, None


def test_the_section_lists_the_package_modules():
    assert {"mpkit", "mpkit.parallel", "mpkit.sim", "mpkit.plot", "mpkit.quiz", "mpkit.models"} <= set(API)


@pytest.mark.parametrize("module", sorted(API))
def test_every_listed_name_exists(module):
    imported = importlib.import_module(module)
    if module == "mpkit.plot":
        assert imported.__all__
    missing = [name for name in API[module] if not hasattr(imported, name)]
    assert missing == []


def test_labs_import_only_public_names():
    private = []
    for lab, module, name in lab_imports():
        if name is None:
            ok = module in API
        elif f"{module}.{name}" in API:  # a public submodule: from mpkit.quiz import seedmap
            ok = True
        elif module == "mpkit.plot":
            ok = name in importlib.import_module(module).__all__
        else:
            ok = module in API and name in API[module]
        if not ok:
            private.append(f"{lab}: from {module} import {name}")
    assert private == []
