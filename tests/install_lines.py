"""The README's install commands, and the requirement files they name read the way pip reads them.

Shared by the install tests and the Binder test, so no test keeps its own copy of the README's words.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def readme_section(heading: str, repo: Path = REPO) -> str:
    """The text of ``## <heading>...`` up to the next ``## `` heading."""
    text = (repo / "README.md").read_text(encoding="utf-8")
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        if part.startswith(heading):
            return part
    raise AssertionError(f"README has no section '## {heading}'")


def readme_commands(heading: str, repo: Path = REPO) -> list[str]:
    """Every command line of the section's ```bash blocks (comments and blank lines left out)."""
    blocks = re.findall(r"```bash\n(.*?)```", readme_section(heading, repo), re.S)
    lines = (line.split(" #", 1)[0].strip() for block in blocks for line in block.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def readme_command(heading: str, repo: Path = REPO) -> str:
    """The one command of a section that must hold exactly one (the two commands of the README)."""
    commands = readme_commands(heading, repo)
    assert len(commands) == 1, f"README section {heading!r} should hold exactly one command, has {commands}"
    return commands[0]


def readme_install_line(naming: str, repo: Path = REPO) -> str:
    """The command of the README's Install section that names ``naming`` (e.g. requirements-cpu.txt)."""
    found = [c for c in readme_commands("Install", repo) if naming in c]
    assert len(found) == 1, f"README's Install section should have one command naming {naming}, has {found}"
    return found[0]


def pip_install_files(command: str, repo: Path = REPO) -> list[Path]:
    """The requirement files (``-r FILE``) of the ``pip install`` in a shell command line."""
    words = shlex.split(command.split("&&")[0])
    assert words[:2] == ["pip", "install"], f"not a pip install command: {command!r}"
    files = [repo / words[i + 1] for i, word in enumerate(words) if word == "-r"]
    assert files, f"{command!r} installs no requirement file"
    return files


def read_requirements(path: Path) -> tuple[list[Requirement], list[str]]:
    """``(requirements, options)`` of a requirement file, nested ``-r`` files included (relative to
    the file that names them, as pip reads them)."""
    requirements, options = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-r "):
            nested = read_requirements(path.parent / line[3:].strip())
            requirements += nested[0]
            options += nested[1]
        elif line.startswith("-"):
            options.append(line)
        else:
            requirements.append(Requirement(line))
    return requirements, options


def pins(paths) -> dict[str, str]:
    """``{normalised name: exact version}`` of the files' requirements; each must be pinned with ``==``.

    A package named twice (the CPU file names torch 2.13.0 and 2.13.0+cpu) must agree on the public
    version and keeps its most exact pin. Packages behind environment markers (TensorFlow's two
    spellings) are keyed with their marker.
    """
    out: dict[str, str] = {}
    for path in paths:
        for req in read_requirements(path)[0]:
            specs = list(req.specifier)
            assert len(specs) == 1 and specs[0].operator == "==", f"{path.name}: {req} is not pinned with =="
            spec = specs[0]
            key = canonicalize_name(req.name) + (f"; {req.marker}" if req.marker else "")
            if key in out:
                assert public(out[key]) == public(spec.version), f"{key} is pinned to {out[key]} and {spec.version}"
            if key not in out or len(spec.version) > len(out[key]):
                out[key] = spec.version
    return out


def public(version: str) -> str:
    """The version without its local label: ``2.13.0+cpu`` -> ``2.13.0``."""
    return version.split("+", 1)[0]
