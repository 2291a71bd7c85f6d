"""The first lab drills a short set of overview items; lab 09 drills the rest, and both read the
same list. Plain json + PyYAML: the notebooks are read as files, the bank as YAML."""
import json
import re
from pathlib import Path

import yaml

LABS = Path(__file__).resolve().parents[1] / "labs"
BANK = Path(__file__).resolve().parents[1] / "quizzes"


def first_drill(notebook):
    """The FIRST_DRILL list written in a notebook's code cells."""
    nb = json.loads((LABS / notebook).read_text(encoding="utf-8"))
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    match = re.search(r"^FIRST_DRILL = (\[.*?\])$", code, re.M)
    assert match, f"{notebook} has no FIRST_DRILL = [...] line"
    return json.loads(match.group(1))


def test_lab00_drills_about_eight_overview_items_and_lab09_the_same_list():
    overview = [item["id"] for item in yaml.safe_load((BANK / "overview.yaml").read_text(encoding="utf-8"))["items"]]
    drill = first_drill("00_start_here.ipynb")
    assert 6 <= len(drill) <= 10 and len(set(drill)) == len(drill)
    assert set(drill) <= set(overview)
    assert first_drill("09_exam_review.ipynb") == drill      # lab 09 shows exactly the rest
    assert len(overview) - len(drill) >= 15
