"""The lab as a student meets it: JupyterLab in a real (headless) Chromium.

Runs every cell of two labs (the start page and lab 02) through the UI, answers quiz items by clicking, switches the
language, and checks the rendered feedback, the plots and the saved answers file. Uses Debian's
Chromium (``/usr/bin/chromium``; ``.ci/run`` installs it with Hangul fonts) — never a browser
downloaded by Playwright. Screenshots go to ``artifacts/browser/`` (ignored by git).
"""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import playwright.sync_api as sync_api
import pytest

from lab_server import jupyter_lab
from procutil import descendants, listening_sockets_of

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts" / "browser"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
STUDENT = "browser-test"
# the start page, and one teaching lab with plots and a quiz: lab 02 (10 s of cells) rather than lab 04
# (24 s, 59 s in the browser on CI): the UI path is the same, and nbval runs every lab anyway
NOTEBOOKS = ["00_start_here.ipynb", "02_model_parallel.ipynb"]
RUN_ALL_TIMEOUT_MS = 180_000



@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """JupyterLab on 127.0.0.1 with a random port and token, serving a copy of labs/ (running
    cells through the UI autosaves outputs, which must never touch the committed notebooks)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium and fonts-nanum "
                    "(apt-get install chromium fonts-nanum), as .ci/run does")
    work = tmp_path_factory.mktemp("browser")
    shutil.copytree(REPO / "labs", work / "labs")
    results = work / "quiz_results"
    env = {"MPKIT_RESULTS_DIR": str(results), "MPKIT_STUDENT": STUDENT, "MPKIT_QUIZ_DIR": str(REPO / "quizzes")}
    with jupyter_lab("python -m jupyter lab", cwd=work / "labs", workdir=work, env=env) as (url, token, log):
        yield {"url": url, "token": token, "results": results, "log": log}
        # The server and its kernels, while they run: this fixture's process tree (the browser
        # fixture, set up after this one, is closed by now). A kernel that outlives the server is
        # reparented away from us, so the pids are taken here, not after the stop.
        server_tree = descendants()
    # Only sockets these processes hold count: other work on the host opens and closes ports of its own.
    # The price: a kernel child already reparented to init before this point is not seen here;
    # tests/test_orphans.py checks that no rank outlives its kernel.
    deadline = time.monotonic() + 30  # kernels close their five ZMQ ports shortly after shutdown
    while (leaked := listening_sockets_of(server_tree)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leaked, f"ports still listening 30 s after the server stopped: {sorted(leaked.values())}"


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


def open_notebook(browser, server, name):
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, locale="ko-KR")
    errors = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    workspace = re.sub(r"\W", "-", name)  # a fresh workspace per notebook: only its own panel is open
    page.goto(f"{server['url']}/lab/workspaces/{workspace}/tree/{name}?reset&token={server['token']}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
    sync_api.expect(page.locator(".jp-NotebookPanel-toolbar .jp-KernelName")).to_contain_text("Python", timeout=90_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
    return page, errors


def run_all_cells(page):
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')];
            return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
        }""", timeout=RUN_ALL_TIMEOUT_MS)


def assert_no_cell_errors(page):
    tracebacks = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                              has_text="Traceback")
    errors = page.locator(".jp-RenderedText[data-mime-type='application/vnd.jupyter.error']")
    assert errors.count() == 0 and tracebacks.count() == 0, errors.all_inner_texts()[:1] or tracebacks.all_inner_texts()[:1]


def quiz_item_ids(page):
    classes = page.locator(".mpkit-quiz-item").evaluate_all("els => els.map(e => e.className)")
    return [re.search(r"mpkit-item-(\S+)", c).group(1) for c in classes]


def our_console_errors(errors):
    return [e for e in errors if re.search(r"mpkit|widget|ipywidgets|jupyter-widgets", e, re.I)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_lab_runs_and_quiz_answers_in_browser(lab_server, browser, notebook):
    from mpkit.quiz import load_bank

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page, console_errors = open_notebook(browser, lab_server, notebook)
    try:
        run_all_cells(page)
        assert_no_cell_errors(page)
        assert page.locator(".jp-OutputArea-output img[src^='data:image/png']").count() >= 1, "no plot rendered"

        quiz = page.locator(".mpkit-quiz").last
        quiz.scroll_into_view_if_needed()
        bank = load_bank(Path(REPO / "quizzes"))
        shown = quiz_item_ids(page)
        true_items = [i for i in shown if bank.items[i].answer == "O"]
        assert len(true_items) >= 2, f"the quiz shows fewer than two O items: {shown}"
        right, wrong = true_items[:2]

        page.locator(f".mpkit-item-{right} .mpkit-quiz-o").click()
        page.locator(f".mpkit-item-{wrong} .mpkit-quiz-x").click()
        right_feedback = page.locator(f".mpkit-item-{right} .mpkit-quiz-feedback")
        wrong_feedback = page.locator(f".mpkit-item-{wrong} .mpkit-quiz-feedback")
        sync_api.expect(right_feedback).to_contain_text("정답입니다")
        sync_api.expect(wrong_feedback).to_contain_text("오답입니다")
        sync_api.expect(wrong_feedback).to_contain_text(bank.items[wrong].explanation["ko"][:20])
        page.screenshot(path=str(ARTIFACTS / f"{notebook}-answered-ko.png"), full_page=False)

        statement = page.locator(f".mpkit-item-{right}")
        sync_api.expect(statement).to_contain_text(bank.items[right].statement["ko"][:20])
        quiz.locator(".mpkit-quiz-lang button", has_text="English").click()
        sync_api.expect(statement).to_contain_text(bank.items[right].statement["en"][:20])
        sync_api.expect(right_feedback).to_contain_text("Correct")
        page.screenshot(path=str(ARTIFACTS / f"{notebook}-answered-en.png"), full_page=False)

        saved = json.loads((lab_server["results"] / f"{STUDENT}.json").read_text(encoding="utf-8"))
        assert saved["items"][right]["answer"] == "O" and saved["items"][right]["correct"] is True
        assert saved["items"][wrong]["answer"] == "X" and saved["items"][wrong]["correct"] is False
        assert not our_console_errors(console_errors), our_console_errors(console_errors)
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / f"{notebook}-failure.png"), full_page=True)
        print(lab_server["log"].read_text(errors="replace")[-4000:])
        raise
    finally:
        page.close()


@pytest.mark.timeout(600)
def test_assignment_answers_are_saved_inside_the_notebook(lab_server, browser, tmp_path):
    """A widget click cannot write into a saved notebook; the hand-in cell's output can. Clicked,
    submitted, hand-in run, Ctrl+S: the file on disk alone grades to the right score."""
    from mpkit.quiz import load_bank
    from mpkit.quiz.assignment import write_assignment
    from mpkit.quiz.handin import HAND_IN_ID, MIME
    from mpkit.quiz.instructor import grade

    bank = load_bank(REPO / "quizzes")
    items = bank.select(["pp-001", "pp-002"])
    right, wrong = items[0], items[1]
    path = lab_server["results"].parent / "labs" / "hw-browser.ipynb"
    write_assignment(items, bank, path, name="hw-browser", lang="en", mode="exam")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page, console_errors = open_notebook(browser, lab_server, path.name)
    try:
        run_all_cells(page)
        assert_no_cell_errors(page)
        page.locator(f".mpkit-item-{right.id} .mpkit-quiz-{right.answer.lower()}").click()
        page.locator(f".mpkit-item-{wrong.id} .mpkit-quiz-{'x' if wrong.answer == 'O' else 'o'}").click()
        page.locator(".mpkit-quiz-submit").click()
        sync_api.expect(page.locator(".mpkit-quiz-score")).to_contain_text("1/2")
        hand_in = page.locator(".jp-CodeCell").last
        hand_in.locator(".jp-InputArea-prompt").click()          # select the hand-in cell, run it again in place
        page.keyboard.press("Control+Enter")
        sync_api.expect(hand_in.locator(".mpkit-answer-sheet")).to_contain_text("answered 2 of 2 items",
                                                                              timeout=60_000)
        page.keyboard.press("Control+s")
        deadline = time.monotonic() + 30
        while MIME not in path.read_text(encoding="utf-8"):
            assert time.monotonic() < deadline, "the saved notebook never got the answer sheet"
            time.sleep(0.5)
        page.screenshot(path=str(ARTIFACTS / "assignment-handed-in.png"), full_page=False)
        saved = json.loads(path.read_text(encoding="utf-8"))
        cell = next(c for c in saved["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == HAND_IN_ID)
        sheet = next(o["data"][MIME] for o in cell["outputs"] if MIME in o.get("data", {}))
        assert sheet["answers"] == {right.id: [right.answer], wrong.id: ["X" if wrong.answer == "O" else "O"]}
        collected = tmp_path / "collected"
        collected.mkdir()
        shutil.copy(path, collected / "kim-2024001.ipynb")
        report = grade([collected], bank, items, assignment="hw-browser")
        assert report.bad == [] and [(s["student"], s["correct"], s["total"]) for s in report.summary] == \
            [("kim-2024001", 1, 2)]
        assert not our_console_errors(console_errors), our_console_errors(console_errors)
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / "assignment-failure.png"), full_page=True)
        print(lab_server["log"].read_text(errors="replace")[-4000:])
        raise
    finally:
        page.close()
