"""The package's layering, as ARCHITECTURE.md draws it: each module imports only its own layer or
lower ones, each folder of ``mpkit/`` is one layer (so no folder imports a folder above it), the
import graph has no cycle, no strategy module imports another (what they share lives in
``strategies/base.py``, ``loop.py``, ``checks.py``, ``programs.py`` or in ``mpkit.parallel``), and
imports inside functions are kept for heavy optional dependencies (never to dodge a cycle)."""
import ast
import subprocess
import sys
from pathlib import Path

from test_import_cycles import cycles

PACKAGE = Path(__file__).resolve().parents[1] / "mpkit"

# Lowest first, by folder (``mpkit.costmodel``) or top-level module (``mpkit.whole``): a module
# belongs to the layer of its folder.
LAYERS = [
    ("foundations", ["mpkit.errors", "mpkit.i18n", "mpkit.lazy", "mpkit.whole", "mpkit.vocabulary", "mpkit.layout",
                     "mpkit.registry"]),
    ("models", ["mpkit.models", "mpkit.config"]),
    ("observe", ["mpkit.observe"]),
    ("simulator", ["mpkit.simulator"]),
    ("runtime", ["mpkit.runtime"]),
    ("parallel", ["mpkit.parallel"]),
    ("pricing", ["mpkit.pricing"]),
    ("strategies", ["mpkit.strategies", "mpkit.crosscheck"]),
    ("train", ["mpkit.training"]),
    ("cost model", ["mpkit.costmodel"]),
    ("plots", ["mpkit.plot"]),
    ("widgets", ["mpkit.widgets"]),
    ("teaching", ["mpkit.quiz", "mpkit.tf", "mpkit.exercises", "mpkit.capstone"]),
    ("command line", ["mpkit.cli", "mpkit.__main__"]),
    ("public names of the cost model", ["mpkit.sim"]),
    ("package", ["mpkit"]),
]
# Imports a function may make on first use: heavy and needed by few callers, or not on every
# platform (``resource`` is POSIX only). ``mpkit.plot`` stands for matplotlib in the command line.
LAZY_OK = {"tensorflow", "nbformat", "matplotlib", "matplotlib.pyplot", "nbclient", "IPython.display", "resource",
           "mpkit.plot"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(name: str) -> int:
    matches = [(len(p), index) for index, (_, prefixes) in enumerate(LAYERS) for p in prefixes
               if name == p or name.startswith(p + ".")]
    assert matches, f"{name} belongs to no layer: add it to LAYERS (and to ARCHITECTURE.md)"
    return max(matches)[1]


def imports(path: Path):
    """(imported mpkit module or external name, inside a function?) for every import statement."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    functions = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f)}
    for node in ast.walk(tree):
        local = id(node) in functions
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, local
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:  # ``from mpkit.sim import formulas`` imports a submodule
                full = f"{base}.{alias.name}"
                yield (full if (PACKAGE.parent / (full.replace(".", "/") + ".py")).exists()
                       or (PACKAGE.parent / full.replace(".", "/")).is_dir() else base), local


def graph():
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        out[module_name(path)] = list(imports(path))
    return out


GRAPH = graph()


def test_every_module_has_a_layer():
    for name in GRAPH:
        layer_of(name)


def folder_of(name: str) -> str:
    """The folder of ``mpkit/`` (``mpkit.costmodel``) or the top-level module (``mpkit.whole``) a module is in."""
    return ".".join(name.split(".")[:2])


def upward_folder_imports(graph) -> list:
    """(folder, the higher-layer folder it imports) for every folder that imports upward."""
    return sorted({(folder_of(name), folder_of(dep)) for name, deps in graph.items() for dep, _ in deps
                   if dep in graph and layer_of(folder_of(dep)) > layer_of(folder_of(name))})


def test_each_layer_is_whole_folders():
    """A layer names folders and top-level modules, never a module inside a folder: one folder, one
    layer, so a newcomer reads the layering off ``mpkit/`` (``sim/`` once spanned four)."""
    inside = [prefix for _, prefixes in LAYERS for prefix in prefixes if prefix.count(".") > 1]
    assert inside == []
    for name in GRAPH:
        assert layer_of(name) == layer_of(folder_of(name)), name


def test_no_folder_imports_a_folder_above_it():
    assert upward_folder_imports(GRAPH) == []


def test_an_upward_folder_import_is_caught():
    """The check above can fail: the simulator (layer 4) importing the planner (layer 10) is named."""
    graph = {"mpkit.simulator.engine": [("mpkit.costmodel.plan", False), ("mpkit.errors", False)],
             "mpkit.costmodel.plan": [("mpkit.simulator.engine", False)], "mpkit.errors": []}
    assert upward_folder_imports(graph) == [("mpkit.simulator", "mpkit.costmodel")]


def test_the_cost_models_public_face_holds_no_module():
    """``mpkit.sim`` only re-exports: a submodule there could share a public name and replace it
    when imported (``mpkit.sim.plan``, module and function, issue 31). Code goes to its layer's folder."""
    assert sorted(p.name for p in (PACKAGE / "sim").iterdir() if p.name != "__pycache__") == ["__init__.py"]


def test_no_import_points_up():
    upward = []
    for name, deps in GRAPH.items():
        for dep, _ in deps:
            if dep.startswith("mpkit") and dep in GRAPH and layer_of(dep) > layer_of(name):
                upward.append(f"{name} ({LAYERS[layer_of(name)][0]}) imports {dep} ({LAYERS[layer_of(dep)][0]})")
    assert upward == []


def test_the_import_graph_has_no_cycle():
    edges = {name: {dep for dep, _ in deps if dep in GRAPH and dep != name} for name, deps in GRAPH.items()}
    assert cycles(edges) == []  # the whole checkout's files: tests/test_import_cycles.py


def strategy_imports(graph, strategies) -> list:
    """"<strategy> imports <strategy>" for every import of one strategy module by another."""
    return sorted(f"{name} imports {dep}" for name in strategies for dep, _ in graph.get(name, [])
                  if dep in strategies and dep != name)


def test_no_strategy_imports_another():
    from mpkit.strategies import REGISTRY

    strategies = {module for module, _ in REGISTRY.values()}
    assert strategies <= set(GRAPH)
    assert strategy_imports(GRAPH, strategies) == []


def test_a_strategy_importing_another_is_caught():
    graph = {"mpkit.strategies.mp": [("mpkit.strategies.pp", False), ("mpkit.strategies.loop", False)],
             "mpkit.strategies.pp": [("mpkit.strategies.checks", False)]}
    assert strategy_imports(graph, {"mpkit.strategies.mp", "mpkit.strategies.pp"}) == [
        "mpkit.strategies.mp imports mpkit.strategies.pp"]


def test_function_local_imports_are_only_heavy_optional_dependencies():
    local = sorted({f"{name}: {dep}" for name, deps in GRAPH.items() for dep, inside in deps
                    if inside and dep not in LAZY_OK and not dep.startswith("tensorflow")})
    assert local == []


def test_the_command_line_loads_matplotlib_only_to_draw():
    probe = ("import sys\nfrom mpkit.cli import build_parser\nbuild_parser().parse_args(['quiz', 'lint'])\n"
             "print(sorted(m for m in ('matplotlib', 'mpkit.plot') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
