"""Every section and claim of the seed note is taught by a lab and drilled by the quiz bank.

``labs/seed_map.yaml`` says where (notebook + markdown heading) and with what (quiz topics and
items). This test parses the seed note itself, so a claim added to the note, a heading renamed
in a notebook or a quiz item re-sourced shows up here. Plain pytest + PyYAML + json: it reads the
notebooks as files and the bank as YAML, without importing mpkit.

The seed lives in ``shared/seed/`` beside the clone (CI and the workspace have it there); the
repository carries an exact copy in ``labs/seed/`` so the test also runs without ``shared/``.
"""
from __future__ import annotations

import glob
import json
import re
import unicodedata
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
LABS = REPO / "labs"
QUIZZES = REPO / "quizzes"
SEED_NAME = "model_parallelism_notes.ko.txt"
SHARED_SEED = Path(__file__).resolve().parents[2] / "shared" / "seed" / SEED_NAME
SEED_COPY = LABS / "seed" / SEED_NAME
MAP_FILE = LABS / "seed_map.yaml"

GROUP = re.compile(r"^ㅁ\s*(?P<name>.+?)\s*$")
SECTION = re.compile(r"^ㅇ\s*(?P<name>.+?)\s*:?\s*$")
NUMBERED = re.compile(r"^(?P<number>\d+)\.\s+(?P<name>.+?)\s*$")
CLAIM = re.compile(r"^[–-]\s*(?P<text>.+?)\s*$")


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def parse_seed(text: str):
    """(sections, other_lines): ``sections`` maps each section heading line to its claim lines
    (in order); ``other_lines`` are the non-empty lines that are neither (group headings,
    lead-in lines ending in ':', prose)."""
    sections: dict[str, list[str]] = {}
    other: list[str] = []
    current = None
    for raw in nfc(text).splitlines():
        line = raw.strip()
        if not line:
            continue
        if GROUP.match(line):
            current = None
            other.append(line)
        elif SECTION.match(line) or NUMBERED.match(line):
            current = line
            sections[current] = []
        elif CLAIM.match(line) and not line.endswith(":") and current is not None:
            sections[current].append(line)
        else:
            other.append(line)
    return sections, other


def load_map():
    with open(MAP_FILE, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def seed_text() -> str:
    return (SHARED_SEED if SHARED_SEED.exists() else SEED_COPY).read_text(encoding="utf-8")


def notebook_headings(name: str) -> set[str] | None:
    path = LABS / f"{name}.ipynb"
    if not path.exists():
        return None
    nb = json.loads(path.read_text(encoding="utf-8"))
    headings = set()
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        for line in source.splitlines():
            match = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
            if match:
                headings.add(nfc(match.group(1).strip()))
    return headings


def cites(item: dict, source: str) -> bool:
    return any(part.strip() == source for part in str(item.get("source", "")).split(";"))


def load_bank():
    topics, items = {}, {}
    for path in sorted(glob.glob(str(QUIZZES / "*.yaml"))):
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
        if not isinstance(doc, dict) or "topic" not in doc:
            continue  # pitfalls.yaml: tags, not items
        topics[doc["topic"]] = doc.get("items") or []
        for item in topics[doc["topic"]]:
            items[item["id"]] = item
    return topics, items


SEED_MAP = load_map()
SECTIONS, OTHER_LINES = parse_seed(seed_text())
ENTRIES = {nfc(s["seed_heading"]): s for s in SEED_MAP["sections"]}
TOPICS, ITEMS = load_bank()


def places(entry):
    yield entry["notebook"], entry["heading"]
    for extra in entry.get("also") or []:
        yield extra["notebook"], extra["heading"]


def claim_entries():
    for section in SEED_MAP["sections"]:
        for claim in section.get("claims") or []:
            yield pytest.param(section, claim, id=f"{section['source']} | {claim['claim'][:40]}")


def section_entries():
    for section in SEED_MAP["sections"]:
        yield pytest.param(section, id=section["source"])


# ---- the seed itself ----

def test_seed_copy_is_identical_to_shared_seed():
    if not SHARED_SEED.exists():
        pytest.skip(f"no {SHARED_SEED} beside the clone; the committed copy is used")
    assert SEED_COPY.read_bytes() == SHARED_SEED.read_bytes(), (
        f"{SEED_COPY} differs from {SHARED_SEED}: copy the shared seed over it and update seed_map.yaml")


def test_seed_parses_into_the_known_shape():
    # A sanity check of the parser on the note as it is: 8 sections, 26 claim lines.
    assert len(SECTIONS) == 8, list(SECTIONS)
    assert sum(map(len, SECTIONS.values())) == 26
    assert all(SECTIONS.values()), "a section without claim lines"


# ---- completeness of the map ----

def test_every_seed_section_has_exactly_one_entry():
    headings = [nfc(s["seed_heading"]) for s in SEED_MAP["sections"]]
    assert len(headings) == len(set(headings)), "a seed section is mapped twice"
    assert set(headings) == set(SECTIONS), {
        "in the seed, not in the map": sorted(set(SECTIONS) - set(headings)),
        "in the map, not in the seed": sorted(set(headings) - set(SECTIONS))}


@pytest.mark.parametrize("heading", list(SECTIONS))
def test_every_claim_line_is_mapped_exactly_once(heading):
    entry = ENTRIES.get(heading)
    assert entry is not None, f"seed section {heading!r} has no entry in seed_map.yaml"
    lines = SECTIONS[heading]
    claims = [nfc(c["claim"]) for c in entry.get("claims") or []]
    for claim in claims:
        hits = [line for line in lines if claim in line]
        assert len(hits) == 1, f"claim {claim!r} must match exactly one line of {heading!r}, matches {hits}"
    for line in lines:
        hits = [claim for claim in claims if claim in line]
        assert len(hits) == 1, f"seed line {line[:60]!r}… is matched by {len(hits)} claims of the map (want 1)"


def test_other_seed_lines_are_listed_as_not_claims():
    listed = [nfc(n["text"]) for n in SEED_MAP.get("not_claims") or []]
    unexplained = [line for line in OTHER_LINES if not any(line.startswith(t) for t in listed)]
    assert not unexplained, f"seed lines that are neither a section, a claim nor in not_claims: {unexplained}"
    stale = [t for t in listed if not any(line.startswith(t) for line in OTHER_LINES)]
    assert not stale, f"not_claims entries that match no seed line: {stale}"


# ---- where it is taught ----

def _check_places(entry, what):
    for notebook, heading in places(entry):
        headings = notebook_headings(notebook)
        assert headings is not None, f"{what}: labs/{notebook}.ipynb does not exist"
        assert nfc(heading) in headings, (
            f"{what}: labs/{notebook}.ipynb has no markdown heading {heading!r}; its headings are "
            f"{sorted(headings)}")


@pytest.mark.parametrize("section", section_entries())
def test_section_is_taught_under_an_existing_heading(section):
    _check_places(section, section["source"])


@pytest.mark.parametrize("section,claim", claim_entries())
def test_claim_is_taught_under_an_existing_heading(section, claim):
    _check_places(claim, f"{section['source']} / {claim['claim'][:40]}")


# ---- where it is drilled ----

def _check_topics(entry, source, what):
    topics = entry.get("quiz_topics") or []
    assert topics, f"{what}: no quiz_topics"
    for topic in topics:
        assert topic in TOPICS, f"{what}: quiz topic {topic!r} has no quizzes/*.yaml (topics: {sorted(TOPICS)})"
        assert any(cites(item, source) for item in TOPICS[topic]), (
            f"{what}: no item of topic {topic!r} has source {source!r}")


@pytest.mark.parametrize("section", section_entries())
def test_section_is_drilled_by_its_quiz_topics(section):
    _check_topics(section, section["source"], section["source"])


@pytest.mark.parametrize("section,claim", claim_entries())
def test_claim_is_drilled_by_its_quiz_topics_and_items(section, claim):
    what = f"{section['source']} / {claim['claim'][:40]}"
    _check_topics(claim, section["source"], what)
    for item_id in claim.get("quiz_items") or []:
        assert item_id in ITEMS, f"{what}: quiz item {item_id!r} is not in quizzes/"
        assert cites(ITEMS[item_id], section["source"]), (
            f"{what}: quiz item {item_id!r} has source {ITEMS[item_id].get('source')!r}, not {section['source']!r}")
