"""One nbgrader course for the quiz flows (tests/test_nbgrader.py, tests/test_nbgrader_pasted_cell.py),
built once per session: nbgrader's start-up and one kernel per notebook dominate their time, so the
release, the students' runs and one ``autograde`` serve every test that asserts on them.

Students of hw1, each with their own results folder (their laptop), deleted before grading:

* kim: everything right, plus a cell of code added to the notebook (kept, never run);
* lee: one wrong, one blank, and a hand-edited ``quiz_results/lee.json`` claiming full marks;
* park: exam submitted with 1 right, then every quiz run again and answered right after the key;
* ahn (graded first, by name): kim's answers with the quiz cell pasted once more (issue 36).
"""
import asyncio
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

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


def nbgrader(course, *args, env=None, timeout=400):
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, text=True,
                          capture_output=True, timeout=timeout)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def student_notebook(released, attempts):
    """The released notebook with the student's work: after each quiz cell, a cell that answers
    and submits; a retake runs the quiz cell's code again, then answers again."""
    import nbformat

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
    import nbformat
    from nbclient import NotebookClient

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


def pasted(nb, grade_id):
    """``nb`` with a copy of the cell ``grade_id`` right after it, as Jupyter's copy-paste makes it."""
    import nbformat

    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    nb.cells.insert(at + 1, nbformat.from_dict(json.loads(json.dumps(nb.cells[at]))))
    return nb


def graded_hw1(tmp):
    """assign -> generate_assignment -> validate -> students -> collect -> autograde -> export, in
    ``tmp``; what the tests assert on (their checks of each step stay in the tests)."""
    import nbformat
    from mpkit.cli import main

    course, grader_store = tmp / "course", tmp / "grader-store"
    env = {**os.environ, "MPKIT_QUIZ_DIR": str(GOOD), "MPKIT_RESULTS_DIR": str(grader_store)}
    env.pop("MPKIT_STUDENT", None)
    assigned = main(["quiz", "assign", "--bank", str(GOOD), "--items", ITEMS, "--mode", "exam",
                     "--out", str(course / "source" / "hw1" / "hw1.ipynb")])
    config = (course / "nbgrader_config.py").read_text(encoding="utf-8")
    nbgrader(course, "generate_assignment", "hw1", env=env, timeout=240)
    released = nbformat.read(course / "release" / "hw1" / "hw1.ipynb", as_version=4)
    validated = nbgrader(course, "validate", "release/hw1/hw1.ipynb", "source/hw1/hw1.ipynb", env=env, timeout=240)

    folders = asyncio.run(run_students(released, tmp / "students", env))
    notebooks = {"ahn": pasted(nbformat.read(folders["kim"] / "hw1.ipynb", as_version=4), "quiz_model_parallel")}
    notebooks.update({s: nbformat.read(f / "hw1.ipynb", as_version=4) for s, f in folders.items()})
    for student, nb in notebooks.items():                         # collect: the notebook only ...
        (course / "submitted" / student / "hw1").mkdir(parents=True)
        nbformat.write(nb, course / "submitted" / student / "hw1" / "hw1.ipynb")
    shutil.rmtree(tmp / "students")                                # ... and the laptops are gone
    cheat = course / "submitted" / "lee" / "hw1" / "quiz_results" / "lee.json"   # ... but lee adds an edited file
    cheat.parent.mkdir()
    cheat.write_text(json.dumps({"format": "mpkit-quiz-results", "version": 2, "student": "lee", "items": {
        item: {"answer": a, "correct": True, "at": "2025-01-01T00:00:00", "box": 5,
               "history": [{"answer": a, "correct": True}]} for item, a in KEY.items()}}), encoding="utf-8")
    kim_files = sorted(p.name for p in (course / "submitted" / "kim" / "hw1").iterdir())
    ran = tmp / "student-code-ran"   # ... and kim adds a cell of code to the notebook
    kim = course / "submitted" / "kim" / "hw1" / "hw1.ipynb"
    nb = nbformat.read(kim, as_version=4)
    nb.cells.insert(2, nbformat.v4.new_code_cell(f"open({str(ran)!r}, 'w').write('ran')"))
    nbformat.write(nb, kim)

    log = nbgrader(course, "autograde", "hw1", env=env, timeout=240)
    nbgrader(course, "export", env=env, timeout=240)
    with open(course / "grades.csv", newline="", encoding="utf-8") as f:
        scores = {row["student_id"]: (float(row["score"]), float(row["max_score"])) for row in csv.DictReader(f)}
    return SimpleNamespace(assigned=assigned, config=config, released=released, validated=validated,
                           kim_files=kim_files, log=log, scores=scores, ran=ran, grader_store=grader_store,
                           autograded=course / "autograded")
