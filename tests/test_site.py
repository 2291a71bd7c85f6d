"""The labs as a website (``python site/build.py``), as a reader meets it in Chromium.

Builds the site once into a temporary folder (every lab runs once, top to bottom; a lab this
session's nbval pass already ran, kept by the root conftest.py, is taken from it), serves it on
127.0.0.1 and opens every page in Debian's Chromium (as ``test_browser.py``, never a downloaded
browser): its figures loaded, its Korean text drawn with a Hangul font, its internal links and
their anchors present, a Binder link, and on the item-bank pages keys that stay hidden until
clicked. Screenshots of failures go to ``artifacts/site/``.
"""
from __future__ import annotations

import functools
import html
import http.server
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import playwright.sync_api as sync_api
import pytest

from executed_labs import CACHE_ENV
from install_lines import readme_command
from test_browser import CHROMIUM, browser  # noqa: F401 (the module's Chromium, a fixture)

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts" / "site"
HANGUL = re.compile(r"[\uac00-\ud7a3]")
# Fonts with Hangul glyphs a page may resolve to (site/_static/hangul.css names them; CI has
# Debian's fonts-nanum). DejaVu and Liberation have none: Korean drawn in them is boxes.
HANGUL_FONTS = re.compile(r"nanum|noto sans (cjk|kr)|apple sd gothic|malgun|un dotum|baekmuk", re.I)
LABS = sorted(path.stem for path in (REPO / "labs").glob("*.ipynb"))
# Whichever test runs first builds the site (every lab once: about 3 minutes on a quiet 2-core
# machine, 8 under load 10), so each test's limit covers the build.
BUILD_TIMEOUT_S = 1000


def build_command() -> list[str]:
    """The README's build command (after its install), with this interpreter."""
    install, build = readme_command("The labs as a website").split(" && ")
    assert "-r site/requirements.txt" in install
    program, *args = shlex.split(build)
    assert program == "python", build
    return [sys.executable, *args]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once for this module by the README's command into a temporary folder; its
    HTML folder and the executed labs it was made from."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium and fonts-nanum, as .ci/run does")
    out = tmp_path_factory.mktemp("site")
    # the labs this session's nbval pass ran (the root conftest.py keeps them), so they run once
    executed = os.environ.get(CACHE_ENV)
    reuse = ["--executed", executed] if executed and Path(executed).is_dir() else []
    build = subprocess.run([*build_command(), "--out", str(out), "--repository", "https://github.com/example/mpkit",
                            *reuse], cwd=REPO, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    print(build.stdout[-1500:])  # each lab's seconds and the whole build's: shown with -s or on failure
    for ran in sorted(Path(executed).glob("*.ipynb")) if reuse else ():  # a lab nbval ran is not run again
        unchanged_since = (REPO / "labs" / ran.name).stat().st_mtime < ran.stat().st_mtime
        assert not unchanged_since or f"{ran.name}: already run" in build.stdout, build.stdout[-3000:]
    return out / "_build" / "html", out / "src" / "labs"


@pytest.fixture(scope="module")
def server(site):
    """The built HTML on a random 127.0.0.1 port, served from this process (stopped after)."""
    handler = functools.partial(_QuietHandler, directory=str(site[0]))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _Anchors(HTMLParser):
    """Every id (and old-style a name) on a page: the targets a #fragment may name."""

    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value)


@functools.lru_cache(maxsize=None)
def anchors(html_dir: Path, path: str) -> set:
    parser = _Anchors()
    parser.feed((html_dir / path).read_text(encoding="utf-8"))
    return parser.ids


def pages(html_dir: Path) -> list[str]:
    """Every page of the site: the home page, each lab, each item-bank topic."""
    found = [str(p.relative_to(html_dir)) for p in sorted(html_dir.glob("*/*.html")) if p.parent.name in ("labs", "quizzes")]
    return ["intro.html", *found]


def expected_figures(executed: Path, lab: str) -> int:
    """The images the lab's run drew (PNG/JPEG/SVG outputs), which its page must show."""
    notebook = json.loads((executed / f"{lab}.ipynb").read_text(encoding="utf-8"))
    return sum(1 for cell in notebook["cells"] for output in cell.get("outputs", [])
               if any(kind.startswith("image/") for kind in output.get("data", {})))


def fonts_drawing(page, selector: str) -> list[str]:
    """The fonts Chromium drew ``selector``'s text with (DevTools' getPlatformFontsForNode)."""
    cdp = page.context.new_cdp_session(page)
    try:
        cdp.send("DOM.enable")
        cdp.send("CSS.enable")
        root = cdp.send("DOM.getDocument")["root"]["nodeId"]
        node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
        return [font["familyName"] for font in fonts if font["glyphCount"] > 0]
    finally:
        cdp.detach()


@pytest.mark.timeout(BUILD_TIMEOUT_S + 100)
def test_every_lab_is_a_page(site):
    html_dir, _ = site
    assert [p.stem for p in sorted((html_dir / "labs").glob("*.html"))] == LABS
    assert LABS and all(name[:2].isdigit() for name in LABS)


def lab_titles() -> dict:
    """{lab: its title}, the first heading of the lab's first markdown cell, backticks dropped (as the
    page's text shows them)."""
    titles = {}
    for lab in LABS:
        cells = json.loads((REPO / "labs" / f"{lab}.ipynb").read_text(encoding="utf-8"))["cells"]
        first = "".join(next(c for c in cells if c["cell_type"] == "markdown")["source"]).splitlines()[0]
        titles[lab] = first.removeprefix("# ").replace("`", "")
    return titles


@pytest.mark.timeout(BUILD_TIMEOUT_S + 100)
def test_the_home_page_lists_labs_by_title_and_the_footer_reads_in_korean(site):
    """The home page listed the labs by file name, and the theme's footer read "으로 mpkit lab"
    (its "By {author}" in Korean)."""
    html_dir, _ = site
    links = dict(re.findall(r'<a class="reference internal" href="labs/([^".]+)\.html">(.*?)</a>',
                            (html_dir / "intro.html").read_text(encoding="utf-8"), re.S))
    # the page's text: tags dropped, entities read, Sphinx's curly apostrophes straightened
    shown = {lab: html.unescape(re.sub(r"<[^>]+>", "", text)).strip().replace("\u2019", "'")
             for lab, text in links.items()}
    assert shown == lab_titles()
    for path in pages(html_dir):
        page = (html_dir / path).read_text(encoding="utf-8")
        footer = page[page.index('<footer class="bd-footer-content'):]
        assert "으로 mpkit lab" not in page and "2026 mpkit lab" in footer, path


@pytest.mark.timeout(BUILD_TIMEOUT_S + 400)
def test_every_page_renders_its_figures_korean_links_and_binder(site, server, browser):
    html_dir, executed = site
    checked_links = 0
    for path in pages(html_dir):
        page = browser.new_page(viewport={"width": 1300, "height": 900}, locale="ko-KR")
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            response = page.goto(f"{server}/{path}", wait_until="load")
            assert response.ok, (path, response.status)
            # figures: every image on the page loaded, and a lab shows every figure its run drew
            images = page.locator("img").evaluate_all(
                "els => els.map(e => ({src: e.getAttribute('src'), ok: e.complete && e.naturalWidth > 0}))")
            assert all(image["ok"] for image in images), (path, [i["src"] for i in images if not i["ok"]])
            if path.startswith("labs/"):
                drawn = page.locator("article .cell_output img").count()
                want = expected_figures(executed, Path(path).stem)
                assert drawn == want, f"{path}: {drawn} figures on the page, {want} drawn by the lab's run"
            # Korean: Hangul in the text and drawn with a Hangul font (not boxes)
            heading = page.locator("article h1").first
            text = page.locator("article").inner_text()
            assert HANGUL.search(text) and re.search(r"[A-Za-z]{4,}", text), f"{path}: not bilingual"
            assert HANGUL.search(heading.inner_text()), f"{path}: the title has no Korean"
            fonts = fonts_drawing(page, "article h1")
            assert any(HANGUL_FONTS.search(f) for f in fonts), f"{path}: Korean drawn with {fonts}"
            # links: each internal one opens a page of the site, and its #anchor is on that page
            hrefs = page.locator("a[href]").evaluate_all("els => els.map(e => e.href)")
            for href in hrefs:
                url, fragment = urldefrag(href)
                if not url.startswith(server):
                    continue
                target = urlparse(url).path.lstrip("/") or "index.html"
                assert (html_dir / target).is_file(), f"{path}: link to missing {target}"
                if fragment and target.endswith(".html"):
                    assert fragment in anchors(html_dir, target), f"{path}: {href} names no anchor"
                checked_links += 1
            binder = [h for h in hrefs if h.startswith("https://mybinder.org/v2/gh/example/mpkit/main?urlpath=")]
            assert binder, f"{path}: no Binder link"
            if path.startswith("labs/"):
                assert any(h.endswith(f"lab/tree/labs/{Path(path).stem}.ipynb") for h in binder), (path, binder)
            assert not errors, (path, errors)
        except BaseException:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"{path.replace('/', '-')}-failure.png"), full_page=True)
            raise
        finally:
            page.close()
    assert checked_links > 100  # the navigation alone links every page from every page


@pytest.mark.timeout(BUILD_TIMEOUT_S + 200)
def test_item_bank_keys_stay_hidden_until_clicked(site, server, browser):
    from mpkit.quiz import load_bank

    bank = load_bank(REPO / "quizzes")
    html_dir, _ = site
    assert sorted(p.stem for p in (html_dir / "quizzes").glob("*.html")) == sorted(bank.topics)
    item = bank.select("pipeline")[1]
    page = browser.new_page(locale="ko-KR")
    try:
        page.goto(f"{server}/quizzes/pipeline.html#{item.id}")
        section = page.locator(f"section#{item.id}")
        sync_api.expect(section).to_contain_text(item.statement["ko"][:20])
        sync_api.expect(section).to_contain_text(item.statement["en"][:20])
        assert page.locator("article details").count() == len(bank.select("pipeline"))
        key = section.get_by_text(item.explanation["en"][:30])
        sync_api.expect(key).to_be_hidden()
        section.locator("details summary").click()
        sync_api.expect(key).to_be_visible()
        sync_api.expect(section.locator("details")).to_contain_text(f"Key: {item.answer}")
    finally:
        page.close()


def test_no_repository_known_is_a_clear_error_before_any_lab_runs(tmp_path):
    """A checkout with no GitHub origin and no ``--repository`` gets no made-up Binder link: the
    build stops at once (no lab executed, nothing laid out) and says what to pass."""
    bare = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(bare)], check=True, timeout=120)
    subprocess.run(["git", "-C", str(bare), "remote", "remove", "origin"], check=True, timeout=30)
    build = subprocess.run([sys.executable, str(bare / "site" / "build.py"), "--out", str(tmp_path / "out")],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 2, build.stdout + build.stderr
    assert "pass --repository https://github.com/OWNER/NAME" in build.stderr
    assert "Traceback" not in build.stderr
    assert not (tmp_path / "out").exists()
