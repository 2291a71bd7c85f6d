"""No import cycle anywhere in the checkout (issue 42): every .py file of ``mpkit/``, ``benchmarks/``,
``tests/`` and ``site/``, imports inside functions included, as Python would resolve them: a
package module by its dotted name from the repository root, a script's plain ``import sibling``
from its own folder (how ``python benchmarks/x.py`` and pytest's rootdir-less test imports find
their neighbours). ``tests/test_layers.py`` checks the package's layers; this checks the rest too
(``benchmarks/pp.py`` and ``benchmarks/pp_schedules.py`` once imported each other)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("mpkit", "benchmarks", "tests", "site")


def _module_file(root: Path, base: Path, dotted: str):
    """The file ``dotted`` names under ``base`` (a module or a package's ``__init__.py``), or None."""
    path = base.joinpath(*dotted.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file() and root in candidate.parents:
            return candidate
    return None


def _resolve(root: Path, importer: Path, dotted: str, level: int = 0):
    if level:  # from . import x: relative to the importing file's package
        base = importer.parent
        for _ in range(level - 1):
            base = base.parent
        return _module_file(root, base, dotted) if dotted else base / "__init__.py"
    return _module_file(root, root, dotted) or _module_file(root, importer.parent, dotted)


def import_graph(root: Path, folders=FOLDERS) -> dict:
    """{file: {files it imports}} for every .py file under ``folders`` of ``root``."""
    graph = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            edges = set()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    targets = [_resolve(root, path, alias.name) for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    targets = []
                    for alias in node.names:  # ``from pkg import sub`` imports the submodule sub
                        sub = f"{base}.{alias.name}" if base else alias.name
                        targets.append(_resolve(root, path, sub, node.level) or _resolve(root, path, base, node.level))
                else:
                    continue
                edges |= {target for target in targets if target is not None and target != path}
            graph[path] = edges
    return graph


def cycles(graph: dict) -> list[str]:
    """Each cycle found by a depth-first walk, as 'a -> b -> a' (paths relative to their common root)."""
    state, found = {}, []

    def visit(node, stack):
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                found.append(" -> ".join(str(p) for p in stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_checkout_has_no_import_cycle():
    graph = {path.relative_to(ROOT): {dep.relative_to(ROOT) for dep in deps}
             for path, deps in import_graph(ROOT).items()}
    assert len(graph) > 250  # the walk saw the checkout, not an empty folder
    assert cycles(graph) == []


def test_a_cycle_between_two_scripts_is_caught(tmp_path):
    """Two scripts importing each other, one of them only inside a function, as benchmarks/pp.py and
    benchmarks/pp_schedules.py did; and a package module importing its sibling by dotted name."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "a.py").write_text("from b import helper\n")
    (tmp_path / "benchmarks" / "b.py").write_text("def helper():\n    import a\n")
    (tmp_path / "mpkit").mkdir()
    (tmp_path / "mpkit" / "__init__.py").write_text("")
    (tmp_path / "mpkit" / "x.py").write_text("from mpkit import y\n")
    (tmp_path / "mpkit" / "y.py").write_text("import mpkit.x\n")
    found = cycles({path.relative_to(tmp_path): {dep.relative_to(tmp_path) for dep in deps}
                    for path, deps in import_graph(tmp_path, ("benchmarks", "mpkit")).items()})
    assert found == ["benchmarks/a.py -> benchmarks/b.py -> benchmarks/a.py", "mpkit/x.py -> mpkit/y.py -> mpkit/x.py"]
