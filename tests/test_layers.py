"""The package's layering, as ARCHITECTURE.md draws it: each module imports only its own layer or
lower ones, the import graph has no cycle, and imports inside functions are kept for heavy
optional dependencies (never to dodge a cycle)."""
import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mpkit"

# Lowest first. A module belongs to the layer of the longest prefix that matches its name.
LAYERS = [
    ("foundations", ["mpkit.errors", "mpkit.i18n", "mpkit.lazy", "mpkit.whole", "mpkit.layout"]),
    ("models", ["mpkit.models", "mpkit.config"]),
    ("observe", ["mpkit.observe"]),
    ("simulator", ["mpkit.sim.engine", "mpkit.sim.formulas", "mpkit.sim.hardware", "mpkit.sim.machines"]),
    ("runtime", ["mpkit.runtime"]),
    ("parallel", ["mpkit.parallel"]),
    ("pricing", ["mpkit.sim.profile", "mpkit.sim.pricing", "mpkit.sim.pipeline_program"]),
    ("strategies", ["mpkit.strategies", "mpkit.crosscheck"]),
    ("train", ["mpkit.training"]),
    ("cost model", ["mpkit.sim"]),
    ("plots", ["mpkit.plot"]),
    ("widgets", ["mpkit.sim.whatif", "mpkit.sim.planwidget"]),
    ("teaching", ["mpkit.quiz", "mpkit.tf", "mpkit.exercises"]),
    ("command line", ["mpkit.cli", "mpkit.__main__"]),
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


def test_no_import_points_up():
    upward = []
    for name, deps in GRAPH.items():
        for dep, _ in deps:
            if dep.startswith("mpkit") and dep in GRAPH and layer_of(dep) > layer_of(name):
                upward.append(f"{name} ({LAYERS[layer_of(name)][0]}) imports {dep} ({LAYERS[layer_of(dep)][0]})")
    assert upward == []


def test_the_import_graph_has_no_cycle():
    edges = {name: {dep for dep, _ in deps if dep in GRAPH and dep != name} for name, deps in GRAPH.items()}
    state, cycle = {}, []

    def visit(node, stack):
        state[node] = "open"
        for dep in sorted(edges[node]):
            if state.get(dep) == "open":
                cycle.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycle == []


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
