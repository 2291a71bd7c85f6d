"""End to end with real nbgrader: assign -> generate_assignment -> validate -> three students answer
in notebooks run by nbclient -> collect -> autograde -> export, and exact scores.

The students answer through ``Quiz.answer()`` and ``Quiz.submit()``, the methods a click on O, X
and Submit calls. Each student has their own results folder (their laptop), deleted before
grading: the submitted notebook alone is graded.

* kim: everything right -> 4 of 4;
* lee: one wrong, one blank, and a hand-edited ``quiz_results/lee.json`` claiming full marks
  submitted beside the notebook -> 2 of 4 (the file is never read);
* park: exam submitted with 1 right, then every quiz run again and answered right after seeing
  the key -> 1 of 4, and the graded notebook reports the retakes.
"""
import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from mpkit.quiz.handin import HAND_IN_ID

GOOD = Path(__file__).parent / "fixtures" / "quiz" / "good"
ITEMS = "mp-001,mp-002,mp-003,pp-001"   # key: O X O O; two quiz cells (model_parallel, pipeline)
KEY = {"mp-001": "O", "mp-002": "X", "mp-003": "O", "pp-001": "O"}
STUDENTS = {
    # quiz cell -> list of attempts; each attempt: answers given, then Submit
    "kim": {"quiz_model_parallel": [{"mp-001": "O", "mp-002": "X", "mp-003": "O"}],
            "quiz_pipeline": [{"pp-001": "O"}]},
    "lee": {"quiz_model_parallel": [{"mp-001": "O", "mp-002": "O"}],           # mp-002 wrong, mp-003 blank
            "quiz_pipeline": [{"pp-001": "O"}]},
    "park": {"quiz_model_parallel": [{"mp-001": "X", "mp-002": "X", "mp-003": "X"},  # 1 right, then the key
                                     {"mp-001": "O", "mp-002": "X", "mp-003": "O"}],  # retake: all right
             "quiz_pipeline": [{"pp-001": "X"}, {"pp-001": "O"}]},
}
EXPECTED = {"kim": 4.0, "lee": 2.0, "park": 1.0}


def nbgrader(course, *args, env):
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, text=True,
                          capture_output=True, timeout=240)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def student_notebook(released, attempts):
    """The released notebook with the student's work: after each quiz cell, a cell that answers
    and submits; a retake runs the quiz cell's code again, then answers again."""
    nb = nbformat.from_dict(json.loads(json.dumps(released)))
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        for number, answers in enumerate(attempts.get(grade_id, [])):
            if number:
                cells.append(nbformat.v4.new_code_cell(cell.source))   # run the quiz cell again
            lines = ["q = _  # the quiz the cell above shows"]
            lines += [f"q.answer({item!r}, {choice!r})  # = a click on {choice}" for item, choice in answers.items()]
            cells.append(nbformat.v4.new_code_cell("\n".join(lines + ["q.submit()  # = the Submit button"])))
    nb.cells = cells
    return nb


async def run_students(released, workdir, env):
    """Each student's notebook, run top to bottom (hand-in last) in their own kernel and folder."""
    async def one(student, attempts):
        nb = student_notebook(released, attempts)
        folder = workdir / student
        folder.mkdir(parents=True)
        student_env = {**env, "MPKIT_RESULTS_DIR": str(folder / "store")}
        await NotebookClient(nb, timeout=120, kernel_name="python3",
                             resources={"metadata": {"path": str(folder)}}).async_execute(env=student_env)
        nbformat.write(nb, folder / "hw1.ipynb")
        return student, folder
    return dict(await asyncio.gather(*(one(s, a) for s, a in STUDENTS.items())))


@pytest.mark.timeout(420)
def test_nbgrader_release_autograde_export(tmp_path):
    course = tmp_path / "course"
    grader_store = tmp_path / "grader-store"
    env = {**os.environ, "MPKIT_QUIZ_DIR": str(GOOD), "MPKIT_RESULTS_DIR": str(grader_store)}
    env.pop("MPKIT_STUDENT", None)

    from mpkit.cli import main
    assert main(["quiz", "assign", "--bank", str(GOOD), "--items", ITEMS, "--mode", "exam",
                 "--out", str(course / "source" / "hw1" / "hw1.ipynb")]) == 0
    assert "configure(c)" in (course / "nbgrader_config.py").read_text(encoding="utf-8")
    nbgrader(course, "generate_assignment", "hw1", env=env)
    released = nbformat.read(course / "release" / "hw1" / "hw1.ipynb", as_version=4)
    hand_in = [c for c in released.cells if c.metadata.get("nbgrader", {}).get("grade_id") == HAND_IN_ID]
    assert len(hand_in) == 1 and "ANSWER_KEY" not in hand_in[0].source and "quiz.hand_in(" in hand_in[0].source
    assert "NotImplementedError" not in json.dumps(released) and "STUDENT" not in json.dumps(released)
    validated = nbgrader(course, "validate", "release/hw1/hw1.ipynb", "source/hw1/hw1.ipynb", env=env)
    assert validated.count("Success! Your notebook passes all the tests.") == 2, validated

    folders = asyncio.run(run_students(released, tmp_path / "students", env))
    for student, folder in folders.items():                       # collect: the notebook only ...
        submitted = course / "submitted" / student / "hw1"
        submitted.mkdir(parents=True)
        shutil.copy(folder / "hw1.ipynb", submitted / "hw1.ipynb")
        shutil.rmtree(folder)                                      # ... and the laptop is gone
    cheat = course / "submitted" / "lee" / "hw1" / "quiz_results" / "lee.json"   # ... but lee adds an edited file
    cheat.parent.mkdir()
    cheat.write_text(json.dumps({"format": "mpkit-quiz-results", "version": 2, "student": "lee", "items": {
        item: {"answer": a, "correct": True, "at": "2025-01-01T00:00:00", "box": 5,
               "history": [{"answer": a, "correct": True}]} for item, a in KEY.items()}}), encoding="utf-8")
    assert sorted(p.name for p in (course / "submitted" / "kim" / "hw1").iterdir()) == ["hw1.ipynb"]

    nbgrader(course, "autograde", "hw1", env=env)
    nbgrader(course, "export", env=env)
    import csv
    with open(course / "grades.csv", newline="", encoding="utf-8") as f:
        scores = {row["student_id"]: (float(row["score"]), float(row["max_score"])) for row in csv.DictReader(f)}
    assert scores == {student: (score, 4.0) for student, score in EXPECTED.items()}

    graded = nbformat.read(course / "autograded" / "park" / "hw1" / "hw1.ipynb", as_version=4)
    cell = next(c for c in graded.cells if c.metadata.get("nbgrader", {}).get("grade_id") == HAND_IN_ID)
    report = cell.outputs[0]["data"]["text/html"]
    assert "4 item(s) answered again after the key was shown: graded on the first answer" in report
    assert cell.outputs[-1]["output_type"] == "execute_result" and cell.outputs[-1]["data"]["text/plain"] == "1.0"
    assert not grader_store.exists()   # autograde never read or wrote the grader's own answers
