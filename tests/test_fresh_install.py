"""A brand-new virtual environment, the README's commands exactly, and JupyterLab answering.

CI's machine already has everything installed, so a missing install step would stay hidden;
this test installs into an empty venv from the README's own words instead.
"""
import os
import re
import subprocess
import venv
from pathlib import Path

import pytest

from lab_server import jupyter_lab

REPO = Path(__file__).resolve().parents[1]


def readme_command(heading):
    """The single bash command in the code block under a README heading."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split(f"## {heading}", 1)[1]
    block = re.search(r"```bash\n(.+?)\n```", section, re.S).group(1).strip()
    assert "\n" not in block, f"README section {heading!r} should hold exactly one command"
    return block


def fresh_checkout(dest):
    """The committed and untracked-but-not-ignored files, as a clone would have them."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in files:
        src = REPO / name
        if src.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(src.read_bytes())
            target.chmod(src.stat().st_mode)
    return dest


def test_readme_has_two_commands_and_ci_runs_the_test_one():
    main, tests = readme_command("Start the lab"), readme_command("Run the tests")
    assert "jupyter lab labs/" in main and "pytest" in tests
    assert tests in (REPO / ".ci" / "run").read_text(encoding="utf-8")


@pytest.mark.timeout(1500)
def test_readme_main_command_works_in_a_fresh_venv(tmp_path):
    checkout = fresh_checkout(tmp_path / "mpkit-lab")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    env = {"PATH": f"{env_dir / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(env_dir),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1"}
    main = readme_command("Start the lab")
    with jupyter_lab(main, cwd=checkout, workdir=tmp_path, env=env, timeout=1200) as (url, token, log):
        python = env_dir / "bin" / "python"
        probe = subprocess.run([str(python), "-c", "import mpkit, torch, ipywidgets, nbval; print(mpkit.__file__, torch.__version__)"],
                               capture_output=True, text=True, check=True, cwd=tmp_path)
        assert str(checkout) in probe.stdout, probe.stdout  # the venv imports the fresh checkout, not this repo
        assert "+cpu" in probe.stdout, f"the venv got a non-CPU torch build: {probe.stdout}"
        served = subprocess.run([str(env_dir / "bin" / "jupyter"), "server", "list", "--json"],
                                capture_output=True, text=True, env={**os.environ, **env,
                                "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime")})
        assert url.split("//")[1] in served.stdout, served.stdout + served.stderr  # the venv's server answers
