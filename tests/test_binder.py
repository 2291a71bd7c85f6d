"""Binder (repo2docker, Linux without a GPU) installs exactly what the README tells such a student."""
from install_lines import REPO, readme_command, readme_install_line

BINDER = REPO / "binder"


def post_build_commands():
    lines = (BINDER / "postBuild").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#") and not line.startswith("set ")]


def test_binder_runs_the_readme_lines_for_linux_without_a_gpu():
    lab_install = readme_command("Start the lab").split(" && jupyter lab")[0]  # Binder starts JupyterLab itself
    assert post_build_commands() == [readme_install_line("requirements-cpu.txt"), lab_install,
                                     readme_install_line("requirements-tf.txt")]


def test_binder_has_only_python_and_post_build():
    # a binder/requirements.txt or environment.yml would install a second, unchecked list
    assert sorted(path.name for path in BINDER.iterdir()) == ["postBuild", "runtime.txt"]
    assert (BINDER / "postBuild").stat().st_mode & 0o111, "postBuild must be executable"
    assert (BINDER / "postBuild").read_text(encoding="utf-8").startswith("#!/usr/bin/env bash\n")
    assert (BINDER / "runtime.txt").read_text(encoding="utf-8").strip() == "python-3.11"
