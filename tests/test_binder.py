"""Binder must build the same lab as requirements.txt: same packages, same versions, CPU torch."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pins(path):
    """{normalised name: version} of the ``name==version`` lines, local tags like +cpu dropped."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        name, sep, version = line.partition("==")
        assert sep, f"{path.name}: {line!r} is not pinned with =="
        out[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.split("+", 1)[0].strip()
    return out


def test_binder_pins_match_requirements():
    assert pins(REPO / "binder" / "requirements.txt") == pins(REPO / "requirements.txt")


def test_binder_takes_cpu_torch_and_installs_the_package():
    binder_reqs = (REPO / "binder" / "requirements.txt").read_text(encoding="utf-8")
    assert re.search(r"^torch==[\d.]+\+cpu$", binder_reqs, re.M), "Binder has no GPU: pin the +cpu torch wheel"
    assert "/whl/cpu" in binder_reqs, "the +cpu wheel needs PyTorch's CPU wheel index"
    post_build = (REPO / "binder" / "postBuild").read_text(encoding="utf-8")
    assert "pip install" in post_build and "-e ." in post_build
    assert (REPO / "binder" / "postBuild").stat().st_mode & 0o111, "postBuild must be executable"
    assert (REPO / "binder" / "runtime.txt").read_text().strip() == "python-3.11"
