"""``mpkit --help`` and a mistyped option answer at once: the command line imports a subcommand's
work (torch, nbformat, the widgets, matplotlib) only when that subcommand runs, never to print help
or a usage error (it took 7-13 s when every subcommand was imported up front; issue 46).
Checked by what is imported, not by a timing, so load cannot flip it."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "numpy", "nbformat", "ipywidgets", "IPython", "matplotlib", "yaml", "mpkit.training", "mpkit.quiz")
HELP_AND_USAGE_ERRORS = [
    ["--help"], ["--bogus"], [],
    ["run", "--help"], ["run", "--stratgy", "pp"], ["run", "--strategy", "nope"], ["run", "--strategy", "pp", "--option", "x"],
    ["tour", "--help"], ["tour", "--lang", "fr"],
    ["quiz", "--help"], ["quiz", "lint", "--help"], ["quiz", "assign", "--topic", "pipeline"],
    ["exercise", "--help"], ["exercise", "assign", "--help"], ["exercise", "lisst"],
]
PROBE = """
import json, sys
from mpkit.cli import main
codes = []
for argv in json.loads(sys.argv[1]):
    try:
        codes.append(main(argv))
    except SystemExit as exc:
        codes.append(exc.code)
print(json.dumps({"codes": codes, "heavy": sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)}))
"""


def test_help_and_usage_errors_import_no_subcommand_work():
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(HELP_AND_USAGE_ERRORS), json.dumps(HEAVY)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["heavy"] == []
    # help exits 0, every usage error 2 with argparse's one-line message (nothing ran)
    assert result["codes"] == [0 if "--help" in argv else 2 for argv in HELP_AND_USAGE_ERRORS]
    assert "Traceback" not in out.stderr
    assert "invalid choice: 'nope'" in out.stderr and "required: --strategy" in out.stderr


def test_a_subcommand_still_runs_its_work():
    """The handler is imported when the subcommand runs: ``quiz lint`` reads and checks the bank."""
    out = subprocess.run([sys.executable, "-m", "mpkit", "quiz", "lint", "--bank", str(REPO / "quizzes")], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "0 errors" in out.stdout
