"""Exercises end to end with real nbgrader 0.9.6: ``mpkit exercise assign`` -> generate_assignment ->
four students -> autograde -> export, with exact points per case (partial credit).

* full: the reference solutions -> 6 of 6;
* partial: a ring that does nothing when the tensor has fewer elements than ranks (3 of 4 cases)
  and a memory formula that forgets to divide by pp·tp (1 of 2) -> 4 of 6, and the autograded
  notebook carries the checker's message for each failed case;
* deadlock: both neighbours send first with blocking sends -> the ring scores 0, the memory
  exercise is still graded (2), autograde finishes;
* tamper: a ring built on dist.all_reduce, and every test cell replaced by ``pass`` -> nbgrader
  restores the test cells, so 2 of 6, not 6.
"""
import csv
import time

import nbformat
import pytest

from mpkit.exercises import EXERCISES, solutions
from nbgrader_course import nbgrader

NAMES = ["ring_all_reduce", "memory_per_gpu"]

RING_SMALL_SKIPPED = '''def ring_all_reduce(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    if tensor.numel() < n:
        return tensor
    chunks = tensor.view(-1).tensor_split(n)
    for phase in ("reduce", "gather"):
        for k in range(n - 1):
            send = chunks[(r - k + (1 if phase == "gather" else 0)) % n]
            into = chunks[(r - k - 1 + (1 if phase == "gather" else 0)) % n]
            buf = torch.empty_like(into)
            works = [dist.isend(send.clone(), (r + 1) % n), dist.irecv(buf, (r - 1) % n)]
            [w.wait() for w in works]
            into.add_(buf) if phase == "reduce" else into.copy_(buf)
    return tensor
'''
MEMORY_NO_SPLIT = '''def memory_per_gpu(params, dp, pp, tp, zero_stage):
    return (2 * params / (dp if zero_stage >= 3 else 1) + 2 * params / (dp if zero_stage >= 2 else 1)
            + 12 * params / (dp if zero_stage >= 1 else 1))
'''
RING_DEADLOCK = '''def ring_all_reduce(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    buf = torch.empty_like(tensor)
    dist.send(tensor, (r + 1) % n)   # everyone sends first: nobody receives
    dist.recv(buf, (r - 1) % n)
    return tensor
'''
RING_COLLECTIVE = '''def ring_all_reduce(ctx, tensor):
    dist.all_reduce(tensor)
    return tensor
'''


def submission(released, answers, tamper=False):
    nb = nbformat.from_dict(released)
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        exercise = meta.get("grade_id", "").rsplit("-", 1)[0]
        if meta.get("solution"):
            cell.source = answers[exercise]
        elif tamper and meta.get("grade"):
            cell.source = "pass"
    return nb


@pytest.mark.timeout(600)
def test_exercise_assignment_autogrades_with_partial_credit(tmp_path):
    course = tmp_path / "course"
    from mpkit.cli import main
    assert main(["exercise", "assign", "--exercises", ",".join(NAMES), "--lang", "en",
                 "--out", str(course / "source" / "ex1" / "ex1.ipynb")]) == 0
    nbgrader(course, "generate_assignment", "ex1")
    released = nbformat.read(course / "release" / "ex1" / "ex1.ipynb", as_version=4)
    text = nbformat.writes(released)
    assert "exchange(send" not in text and "12 * psi" not in text, "a solution reached the students' copy"
    assert "assert _check_" not in text, "a hidden test reached the students' copy"
    stubs = [c.source for c in released.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert len(stubs) == len(NAMES) and all("YOUR CODE HERE" in s and "def " in s for s in stubs), stubs

    reference = {name: solutions.source(EXERCISES[name]) for name in NAMES}
    students = {
        "full": submission(released, reference),
        "partial": submission(released, {"ring_all_reduce": RING_SMALL_SKIPPED, "memory_per_gpu": MEMORY_NO_SPLIT}),
        "deadlock": submission(released, {"ring_all_reduce": RING_DEADLOCK, **{"memory_per_gpu": reference["memory_per_gpu"]}}),
        "tamper": submission(released, {"ring_all_reduce": RING_COLLECTIVE, "memory_per_gpu": reference["memory_per_gpu"]},
                             tamper=True),
    }
    for student, nb in students.items():
        folder = course / "submitted" / student / "ex1"
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / "ex1.ipynb")

    started = time.monotonic()
    log = nbgrader(course, "autograde", "ex1")
    seconds = time.monotonic() - started
    nbgrader(course, "export")
    with open(course / "grades.csv", encoding="utf-8") as f:
        scores = {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(f)}
    assert scores == {"full": 6.0, "partial": 4.0, "deadlock": 2.0, "tamper": 2.0}, scores
    assert seconds < 300, f"autograde took {seconds:.0f} s"

    graded = nbformat.read(course / "autograded" / "partial" / "ex1" / "ex1.ipynb", as_version=4)
    errors = "\n".join(out.get("evalue", "") for cell in graded.cells for out in cell.get("outputs", [])
                       if out.get("output_type") == "error")
    assert "4 ranks, shape (3,)" in errors and "expected" in errors        # the failed ring case, named
    assert "did not divide by pp·tp" in errors                             # the memory hint
    stuck = nbformat.read(course / "autograded" / "deadlock" / "ex1" / "ex1.ipynb", as_version=4)
    assert "deadlock" in nbformat.writes(stuck)

    # nbgrader's checksum warning names only the student who edited test cells (its OverwriteCells
    # warned for every hidden test of every student: 5 per student here, 7 in a newcomer's course)
    assert (course / "nbgrader_config.py").read_text().count("configure(c)") == 1
    warned = {part.split("/ex1", 1)[0]: part.count("'checksum'") for part in log.split("submitted/")[1:]}
    graded_cells = sum(1 for c in released.cells if c.metadata.get("nbgrader", {}).get("grade"))
    assert warned == {"deadlock": 0, "full": 0, "partial": 0, "tamper": graded_cells}, warned
    # feedback lines wrap at the page's width (they ran off it)
    nbgrader(course, "generate_feedback", "ex1", "--student", "partial")
    page = (course / "feedback" / "partial" / "ex1" / "ex1.html").read_text(encoding="utf-8")
    assert "pre { white-space: pre-wrap; overflow-wrap: anywhere; }" in page and "4 ranks, shape (3,)" in page
