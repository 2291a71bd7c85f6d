"""Build the labs as a website: ``python site/build.py`` (README "The labs as a website").

Jupyter Book 1.x renders a source folder this script lays out in ``OUT/src`` (``--out``, default
``site/_build``): ``_config.yml`` and ``_static/`` from beside this file, a copy of ``labs/`` (every
``labs/*.ipynb`` is a page, in file order, run once top to bottom so every figure is on it), one
page per item-bank topic (each statement in Korean and English, its key behind a click) and a
home page. The site is ``OUT/_build/html``. Every page links to Binder.

The labs run here with nbclient, as nbval and ``benchmarks/labs.py`` run them, not by Jupyter
Book's executor: under it (jupyter-cache) a lab's kernel once sat idle waiting for a reply that
never came, halfway through lab 05. ``--executed DIR`` takes labs already run from ``DIR`` instead
(the tests' nbval pass writes them: ``tests/executed_labs.py``), each only if its cells are the lab's.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import nbformat
import yaml
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BINDER = "https://mybinder.org/v2/gh"
EXAM_LAB = "labs/09_exam_review.ipynb"  # where a learner answers the bank's items with widgets
CELL_TIMEOUT_S = 240  # as the labs' nbval run allows a cell (pyproject.toml)


def labs() -> list[Path]:
    """Every lab notebook, in teaching (file name) order: a new ``labs/NN_*.ipynb`` is a new page."""
    return sorted((REPO / "labs").glob("*.ipynb"))


def same_cells(a: Path, b: Path) -> bool:
    """Whether two notebooks hold the same cells (type and source), outputs aside."""
    cells = [[(c.cell_type, c.source) for c in nbformat.read(path, as_version=4).cells] for path in (a, b)]
    return cells[0] == cells[1]


def take_executed(executed: Path | None, notebook: Path) -> bool:
    """Replace ``notebook`` (the copy in the book's source) by the lab of the same name in the
    folder ``executed`` holds, already run, if it is there and has the same cells; returns whether
    it did. ``tests/test_site.py`` passes the labs its own session's nbval run executed, so CI runs
    each lab once."""
    ran = executed / notebook.name if executed else None
    if ran is None or not ran.is_file() or not same_cells(ran, notebook):
        return False
    shutil.copyfile(ran, notebook)
    return True


def execute(notebook: Path) -> float:
    """Run a lab top to bottom in a fresh kernel, in its own folder, and save its outputs in place;
    returns the seconds it took. A cell that raises stops the build (nbclient's CellExecutionError)."""
    nb = nbformat.read(notebook, as_version=4)
    started = time.monotonic()
    NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(notebook.parent)}}).execute()
    nbformat.write(nb, notebook)
    return time.monotonic() - started


def github_repository(config: dict, given: str | None) -> str:
    """The repository the Binder links open: ``--repository``, else the checkout's GitHub
    ``origin``, else ``repository.url`` in ``_config.yml``; none of them is a clear error, never a
    made-up link."""
    if given:
        return check_repository(given, "--repository")
    try:
        origin = subprocess.run(["git", "-C", str(REPO), "remote", "get-url", "origin"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        origin = ""
    found = re.match(r"(?:https://github\.com/|git@github\.com:)([^/]+/[^/]+?)(?:\.git)?$", origin)
    if found:
        return f"https://github.com/{found.group(1)}"
    if config["repository"].get("url"):
        return check_repository(config["repository"]["url"], "repository.url in site/_config.yml")
    where = f"origin is {origin!r}, not GitHub" if origin else "has no origin"
    raise ValueError(f"no GitHub repository for the Binder links: this checkout {where}; "
                     "pass --repository https://github.com/OWNER/NAME (where the labs are published)")


def check_repository(url: str, where: str) -> str:
    if not re.match(r"https://github\.com/[^/]+/[^/]+/?$", url):
        raise ValueError(f"{where} {url!r}: give the repository's GitHub URL, "
                         "https://github.com/OWNER/NAME (Binder's links here open GitHub repositories)")
    return url


def binder_url(repository: str, branch: str, path: str) -> str:
    """mybinder.org opening ``path`` (repository-relative) in JupyterLab."""
    owner_name = repository.removeprefix("https://github.com/").strip("/")
    return f"{BINDER}/{owner_name}/{quote(branch)}?urlpath={quote('lab/tree/' + path, safe='/')}"


def bank_page(bank, topic: str, binder: str) -> str:
    """One topic of the item bank as MyST: every statement in both languages; the key, the
    explanation, the corrected statement and the pitfall in a closed dropdown (``<details>``)."""
    title = bank.titles[topic]
    items = bank.select(topic)
    lines = [f"# {title['ko']} / {title['en']}", "",
             f"O/X 문항 {len(items)}개입니다. 먼저 답을 정한 뒤, 문항 아래의 **정답과 해설**을 눌러 확인하세요. "
             f"위젯으로 풀고 채점하려면 [Binder에서 09번 실습 열기]({binder}).", "",
             f"{len(items)} true/false (O/X) items. Decide first, then click **Key and explanation** under "
             f"an item. To answer them with widgets and a score, [open lab 09 on Binder]({binder}).", ""]
    for item in items:
        lines += [f"## {item.id}", "", f"**한국어** — {item.statement['ko']}", "",
                  f"**English** — {item.statement['en']}", "",
                  ":::{dropdown} 정답과 해설 / Key and explanation", "",
                  f"**정답 / Key: {item.answer}**", "",
                  f"{item.explanation['ko']}", "", f"{item.explanation['en']}", ""]
        if item.corrected:
            lines += [f"바르게 고치면 — {item.corrected['ko']}", "", f"Corrected — {item.corrected['en']}", ""]
        pitfall = bank.pitfalls.get(item.pitfall, {"ko": item.pitfall, "en": item.pitfall})
        lines += [f"함정 / Pitfall: {pitfall['ko']} / {pitfall['en']}", "", ":::", ""]
    return "\n".join(lines)


def lab_title(notebook: Path) -> str:
    """A lab's title: the first ``# `` heading of its first markdown cell (both languages, as its
    page shows it), else its file name."""
    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            first = cell.source.lstrip().splitlines()[0] if cell.source.strip() else ""
            return first[2:].strip() if first.startswith("# ") else notebook.stem
    return notebook.stem


def home_page(notebooks: list[Path], topics: list[tuple[str, dict]], binder: str) -> str:
    lab_rows = "\n".join(f"- [{lab_title(nb)}](labs/{nb.stem}.ipynb)" for nb in notebooks)
    bank_rows = "\n".join(f"- [{title['ko']} / {title['en']}](quizzes/{topic}.md)" for topic, title in topics)
    return f"""# mpkit lab — 모델 병렬화 실습 / hands-on model parallelism

**한국어** — 실습 노트북을 설치 없이 읽을 수 있도록, 한 번씩 처음부터 끝까지 실행한 결과(그림 포함)를
그대로 보여 줍니다. 직접 실행하려면 각 페이지 위쪽의 로켓 단추나 [Binder에서 실습 열기]({binder})를
누르세요. 문제 은행 페이지의 정답은 눌러야 보입니다.

**English** — Every lab, run once top to bottom, with its figures, to read before installing anything.
To run a lab yourself, use the rocket button at the top of its page or [open the labs on Binder]({binder}).
The item bank's keys stay hidden until you click.

## 실습 / Labs

{lab_rows}

## 문제 은행 / Item bank

{bank_rows}
"""


def lay_out(src: Path, repository: str, branch: str) -> list[Path]:
    """Write the book's source folder; returns the lab notebooks it holds."""
    from mpkit.quiz import load_bank  # the bank's own loader: the pages show what the widgets ask

    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(REPO / "labs", src / "labs", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    shutil.copytree(HERE / "_static", src / "_static")
    config = yaml.safe_load((HERE / "_config.yml").read_text(encoding="utf-8"))
    config["repository"].update(url=repository, branch=branch)
    (src / "_config.yml").write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False), encoding="utf-8")
    bank = load_bank(REPO / "quizzes")
    (src / "quizzes").mkdir()
    exam = binder_url(repository, branch, EXAM_LAB)
    for topic in bank.topics:
        (src / "quizzes" / f"{topic}.md").write_text(bank_page(bank, topic, exam), encoding="utf-8")
    notebooks = labs()
    topics = [(topic, bank.titles[topic]) for topic in bank.topics]
    (src / "intro.md").write_text(home_page(notebooks, topics, binder_url(repository, branch, "labs")),
                                  encoding="utf-8")
    toc = {"format": "jb-book", "root": "intro", "parts": [
        {"caption": "실습 / Labs", "chapters": [{"file": f"labs/{nb.stem}"} for nb in notebooks]},
        {"caption": "문제 은행 / Item bank", "chapters": [{"file": f"quizzes/{topic}"} for topic in bank.topics]}]}
    (src / "_toc.yml").write_text(yaml.safe_dump(toc, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return notebooks


def build(out: Path, repository: str | None = None, branch: str = "main", executed: Path | None = None) -> Path:
    """Lay out and build the site in ``out``; returns the folder of its HTML. ``executed``: a folder
    of labs already run (``take_executed``)."""
    config = yaml.safe_load((HERE / "_config.yml").read_text(encoding="utf-8"))
    out = out.resolve()
    started = time.monotonic()
    notebooks = lay_out(out / "src", github_repository(config, repository), branch)
    # The labs' kernels use this checkout's mpkit and item bank (the one the bank's pages show; an
    # installed mpkit may carry another) and save quiz answers in the build folder, never in the
    # user's data folder; they inherit this environment.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    os.environ["MPKIT_QUIZ_DIR"] = str(REPO / "quizzes")
    os.environ["MPKIT_RESULTS_DIR"] = str(out / "quiz_results")
    for notebook in notebooks:
        copy = out / "src" / "labs" / notebook.name
        if take_executed(executed, copy):
            print(f"{notebook.name}: already run, from {executed}", flush=True)
        else:
            print(f"{notebook.name}: {execute(copy):.1f} s", flush=True)
    subprocess.run([sys.executable, "-c", "from jupyter_book.cli.main import main; main()", "build",
                    str(out / "src"), "--path-output", str(out), "--builder", "html", "--keep-going",
                    "--warningiserror"], check=True)
    html = out / "_build" / "html"
    print(f"site built in {time.monotonic() - started:.0f} s: {html / 'index.html'}")
    return html


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "_build", help="build folder (default: site/_build)")
    parser.add_argument("--repository", help="GitHub URL the Binder links open (default: the checkout's GitHub "
                                             "origin, else repository.url in site/_config.yml)")
    parser.add_argument("--branch", default="main", help="branch the Binder links open (default: main)")
    parser.add_argument("--executed", type=Path, metavar="DIR",
                        help="labs already run (e.g. by the tests' nbval pass): a lab there with the same cells "
                             "is taken as it is instead of being run again")
    args = parser.parse_args(argv)
    try:
        build(args.out, args.repository, args.branch, args.executed)
    except ValueError as exc:
        parser.error(str(exc))


if __name__ == "__main__":
    main()
