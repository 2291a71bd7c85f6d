"""The install as a user meets it: the README's own commands in a brand-new venv (the lab's, then
an instructor's nbgrader flow in the same venv), and the package installed from a wheel
(``pip install .``), used from outside the checkout.

CI's machine already has everything installed, so a missing install step would stay hidden; these
tests install into empty venvs from the README's words (parsed, never copied) instead.
"""
import ast
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import tomllib
import venv
from pathlib import Path

import pytest

from install_lines import (CPU_INDEX, REPO, pins, pip_install_files, public, read_requirements,
                           readme_command, readme_commands, readme_install_line, readme_section)
from lab_server import jupyter_lab

LAB_08 = "08_tensorflow_api.ipynb"
TF_MODULES = {"tensorflow", "keras"}  # what lab 08 imports from requirements-tf.txt
TEST_TOOLS = {"pytest", "pytest-timeout", "nbval", "nbclient", "playwright", "nbstripout"}
TEST_ONLY = {"pytest", "nbval", "playwright", "tensorflow"}  # modules only the test install brings


def fresh_checkout(dest):
    """The committed and untracked-but-not-ignored files, as a clone would have them."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.splitlines()
    for name in files:
        src = REPO / name
        if src.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(src.read_bytes())
            target.chmod(src.stat().st_mode)
    return dest


def user_env(tmp_path):
    """A user's shell: no PYTHONPATH (CPython ignores it when empty; set, it would import this
    checkout), and Jupyter's per-user folders empty, so no kernel from this machine is found."""
    return {"PYTHONPATH": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data"), "MPKIT_RESULTS_DIR": str(tmp_path / "results")}


def lab_imports():
    """``{notebook: top-level modules its code cells import}`` for every lab."""
    found = {}
    for path in sorted((REPO / "labs").glob("*.ipynb")):
        modules = set()
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            code = "\n".join(line for line in "".join(cell["source"]).splitlines()
                             if not line.lstrip().startswith(("%", "!")))
            for node in ast.walk(ast.parse(code)):
                if isinstance(node, ast.Import):
                    modules |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    modules.add(node.module.split(".")[0])
        found[path.name] = modules
    return found


def names(pinned):
    """Package names of :func:`pins`' keys, markers dropped."""
    return {key.split(";")[0] for key in pinned}


def run(args, **kwargs):
    """subprocess.run that shows the command's output when it fails."""
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{args} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


# ---------------------------------------------------------------------------------------------
# The README's commands and the requirement files they name (no install)


def test_readme_has_two_commands_and_ci_runs_the_test_one():
    lab, tests = readme_command("Start the lab"), readme_command("Run the tests")
    assert lab.endswith("&& jupyter lab labs/") and tests.endswith("&& python -m pytest")
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert tests in ci_lines, "`.ci/run` must run the README's test command exactly"


def test_cpu_line_pins_the_same_packages_from_pytorchs_cpu_index():
    default_files = pip_install_files(readme_command("Start the lab"))
    cpu_files = pip_install_files(readme_install_line("requirements-cpu.txt"))
    default, cpu = pins(default_files), pins(cpu_files)
    assert {name: public(version) for name, version in cpu.items()} == default
    assert cpu["torch"] == default["torch"] + "+cpu"
    cpu_options = [option for path in cpu_files for option in read_requirements(path)[1]]
    assert cpu_options == [f"--index-url {CPU_INDEX}", "--extra-index-url https://pypi.org/simple"]
    assert not [option for path in default_files for option in read_requirements(path)[1]], \
        "the default line must install from the standard package index only"


def test_readme_checks_pytorchs_index_in_seconds_before_the_cpu_line(tmp_path):
    """Behind a firewall that blocks PyTorch's index the CPU line retried for 16.5 minutes (issue 46):
    README gives a check that answers within its 10 s timeout, and what to do when it fails."""
    section = readme_section("Install")
    check = re.search(r'`(python3 -c "import urllib\.request; [^`]*)`', section).group(1)
    assert f"'{CPU_INDEX}/'" in check and "timeout=10" in check
    assert "--proxy" in section and "--timeout 5 --retries 0" in section and "skip the CPU line" in section
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            for url, reachable in ((f"http://127.0.0.1:{httpd.server_address[1]}/", True),
                                   ("http://127.0.0.1:9/", False)):  # nothing listens on port 9: refused
                command = check.replace(f"{CPU_INDEX}/", url).replace("python3 ", f"{sys.executable} ", 1)
                done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
                assert (done.returncode == 0) == reachable, (url, done.stderr[-500:])
        finally:
            httpd.shutdown()


def test_lab_install_leaves_tensorflow_and_the_test_tools_to_the_test_install():
    lab = names(pins(pip_install_files(readme_command("Start the lab"))))
    tests = names(pins(pip_install_files(readme_command("Run the tests"))))
    tf = names(pins(pip_install_files(readme_install_line("requirements-tf.txt"))))
    assert tf == {"tensorflow", "tensorflow-cpu"}  # one of the two, chosen by platform marker
    assert lab | tf | TEST_TOOLS <= tests  # CI runs every lab, 08 included, as students get them
    assert not (tf | TEST_TOOLS) & lab


def test_lab_08_starts_with_the_command_that_adds_tensorflow():
    cells = json.loads((REPO / "labs" / LAB_08).read_text(encoding="utf-8"))["cells"]
    first_code = next(i for i, cell in enumerate(cells) if cell["cell_type"] == "code")
    before = "".join("".join(cell["source"]) for cell in cells[:first_code])
    # the same file as the README's line, seen from labs/ (the notebook's working folder)
    command = readme_install_line("requirements-tf.txt").replace("-r requirements-tf.txt", "-r ../requirements-tf.txt")
    assert f"%{command}" in before
    assert (REPO / "labs" / "../requirements-tf.txt").is_file()
    assert "tfdist.require()" in "".join(cells[first_code]["source"])  # fails with that command if TF is missing


def test_pyproject_lists_every_package_and_ships_every_bank():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    on_disk = {".".join(init.parent.relative_to(REPO).parts) for init in (REPO / "mpkit").rglob("__init__.py")}
    assert set(setuptools["packages"]) == on_disk | {"mpkit.quizzes"}
    assert setuptools["package-dir"] == {"mpkit.quizzes": "quizzes"}
    assert setuptools["package-data"] == {"mpkit.quizzes": ["*.yaml"]}


# ---------------------------------------------------------------------------------------------
# Real installs into empty venvs


@pytest.mark.timeout(1800)
def test_readme_lab_then_instructor_commands_work_in_a_fresh_venv(tmp_path):
    """The lab install as a student types it, then, in the same venv, the instructor's: its install
    line and the nbgrader flow up to the grades (a newcomer's first ``nbgrader generate_assignment``
    failed when an unpinned alembic needed SQLAlchemy 2; issue 46)."""
    checkout = fresh_checkout(tmp_path / "mpkit-lab")
    venv_line, lab = readme_install_line("venv"), readme_command("Start the lab")
    env = user_env(tmp_path)
    try:
        with jupyter_lab(f"{venv_line} && {lab}", cwd=checkout, workdir=tmp_path, env=env,
                         timeout=1200) as (url, token, log):
            python = checkout / ".venv" / "bin" / "python"
            probe = json.loads(run([str(python), "-c", PROBE, json.dumps(sorted(set().union(*lab_imports().values())))],
                                   cwd=tmp_path, env={**os.environ, **env}))
            assert probe["mpkit"].startswith(str(checkout)), probe  # the venv imports the fresh checkout
            wanted = {name: public(version) for name, version in pins(pip_install_files(lab, checkout)).items()}
            got = {name: public(probe["versions"].get(name, "not installed")) for name in wanted}
            assert got == wanted, "the venv does not hold the README's pins"
            assert set(probe["missing"]) == TF_MODULES, \
                f"labs import {probe['missing']}, which the lab install lacks (only lab 08's TensorFlow may be)"
            assert not TEST_ONLY & set(probe["installed"]), "the lab install pulled in test tools"
            served = run([str(checkout / ".venv" / "bin" / "jupyter"), "server", "list", "--json"],
                         env={**os.environ, **env, "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime")})
            assert url.split("//")[1] in served  # the venv's own server answers
            # a lab top to bottom in the venv's kernel: what the labs need at run time is installed
            run([str(checkout / ".venv" / "bin" / "jupyter"), "execute", "--timeout=240", "00_start_here.ipynb"],
                cwd=checkout / "labs", env={**os.environ, **env})
        graded = run(["bash", "-c", f"exec 2>&1; source .venv/bin/activate && {instructor_script(STUDENT_SUBMITS)}"],
                     cwd=checkout, env={**os.environ, **env})  # its warnings and errors in the text checked
        assert "_NoneName" not in graded and "SAWarning" not in graded, graded[-3000:]
        grades = (checkout / "course" / "grades.csv").read_text(encoding="utf-8")
        assert grades.startswith("assignment,") and ",student1," in grades, grades
    finally:
        shutil.rmtree(checkout / ".venv", ignore_errors=True)  # 1+ GB; pytest keeps old tmp dirs


# the step the README's comment describes between release and autograde: a student's notebook (the
# released one, unanswered) where nbgrader collects it
STUDENT_SUBMITS = "mkdir -p submitted/student1/hw1 && cp release/hw1/hw1.ipynb submitted/student1/hw1/"


def instructor_script(collect: str) -> str:
    """The README's instructor block, from its install line to the first ``nbgrader export``, as one
    shell line (its ``cd course`` holds for the lines after it, as in a terminal), with ``collect``
    before the autograde."""
    commands = readme_commands("For instructors")
    assert commands[0].startswith("pip install -r requirements-instructor.txt"), commands[0]
    block = commands[:next(i for i, c in enumerate(commands) if "nbgrader export" in c) + 1]
    autograde = next(i for i, c in enumerate(block) if "nbgrader autograde" in c)
    return " && ".join([*block[:autograde], collect, *block[autograde:]])


PROBE = f"""
import importlib.metadata, importlib.util, json, re, sys
import mpkit
print(json.dumps({{"mpkit": mpkit.__file__,
                  "missing": sorted(m for m in json.loads(sys.argv[1]) if importlib.util.find_spec(m) is None),
                  "installed": sorted(m for m in {sorted(TEST_ONLY)!r} if importlib.util.find_spec(m) is not None),
                  "versions": {{re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version
                               for d in importlib.metadata.distributions()}}}}))
"""


@pytest.mark.timeout(900)
def test_wheel_install_finds_the_banks_outside_the_checkout(tmp_path):
    """``pip install .`` (not editable), the source copy deleted, then quiz.show and ``mpkit quiz lint``.
    The venv sees the system's packages (torch and the rest: installing them again is the lab test's
    job, and took 80 s) and installs mpkit alone into its own site-packages, which come first, built
    with the setuptools requirements-test.txt pins (no build isolation: no second download)."""
    source = fresh_checkout(tmp_path / "source")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=True)
    env = {**os.environ, **user_env(tmp_path), "PATH": f"{env_dir / 'bin'}:{os.environ['PATH']}"}
    try:
        run([str(env_dir / "bin" / "pip"), "install", "--no-deps", "--no-build-isolation", str(source)],
            cwd=tmp_path, env=env)
        banks = sorted(path.name for path in source.glob("quizzes/*.yaml"))
        shutil.rmtree(source)
        shown = json.loads(run([str(env_dir / "bin" / "python"), "-c", SHOW], cwd=tmp_path, env=env))
        site = Path(run([str(env_dir / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                        env=env).strip())
        assert shown["bank"] == str(site / "mpkit" / "quizzes"), shown
        assert shown["yaml"] == banks, "every quizzes/*.yaml must be package data"
        assert shown["items"] > 0 and shown["titles"]["pipeline"]["en"]
        lint = run([str(env_dir / "bin" / "mpkit"), "quiz", "lint"], cwd=tmp_path, env=env)
        assert f"in {site / 'mpkit' / 'quizzes'}" in lint, lint
    finally:
        shutil.rmtree(env_dir, ignore_errors=True)


SHOW = """
import json
from mpkit import quiz
bank = quiz.load_bank()
shown = quiz.show("pipeline", lang="en")
print(json.dumps({"bank": str(bank.dir), "yaml": sorted(p.name for p in bank.dir.glob("*.yaml")),
                  "items": len(shown.items), "titles": bank.titles}))
"""
