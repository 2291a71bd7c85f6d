"""Load and validate the O/X item bank (``quizzes/<topic>.yaml`` + ``quizzes/pitfalls.yaml``).

The bank ships inside the package as ``mpkit.quizzes`` (pyproject maps the repository's top-level
``quizzes/`` folder there), so an installed lab finds it without a source checkout.

Loading and linting share one reader, :func:`read_bank`, so a notebook and ``mpkit quiz lint``
report the same problems, each pinned to ``file:line`` and item id (line numbers come from the
YAML node marks). :func:`load_bank` refuses a bank with errors; :mod:`mpkit.quiz.lint` adds the
quality checks (duplicates, O/X balance) that do not stop a quiz from running.
"""
import importlib.resources
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mpkit.i18n import LANGS

TOPICS = ("overview", "data_parallel", "model_parallel", "tensor_parallel",
          "pipeline", "communication", "memory", "libraries", "combining", "long_sequence", "faults")
ANSWERS = ("O", "X")
DIFFICULTIES = (1, 2, 3)
PITFALLS_FILE = "pitfalls.yaml"
GLOSSARY_FILE = "glossary.yaml"  # the vocabulary (mpkit.quiz.glossary), not items
REQUIRED = ("id", "statement", "answer", "explanation", "pitfall", "difficulty", "source")
OPTIONAL = ("corrected", "lab", "check")  # check: numeric items a test recomputes from the formula
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # ids become CSS classes and CSV cells


@dataclass(frozen=True)
class Problem:
    """One finding about the bank, printed as ``file:line item-id: message``."""

    file: Path
    line: int | None
    item_id: str | None
    message: str
    severity: str = "error"  # "error" stops load_bank; "warning" is for lint only

    def __str__(self):
        where = f"{self.file}:{self.line}" if self.line else str(self.file)
        who = f" {self.item_id}" if self.item_id else ""
        return f"{where}{who}: {self.message}"


class BankError(ValueError):
    """The bank has errors; ``.problems`` lists them all."""

    def __init__(self, problems):
        self.problems = list(problems)
        shown = [str(p) for p in self.problems[:20]]
        if len(self.problems) > 20:
            shown.append(f"... and {len(self.problems) - 20} more")
        super().__init__("the quiz bank has errors (run `mpkit quiz lint` to see them all):\n"
                         + "\n".join(shown))


@dataclass(frozen=True)
class Item:
    """One O/X statement. Bilingual fields are ``{"ko": ..., "en": ...}``."""

    id: str
    topic: str
    statement: dict
    answer: str
    explanation: dict
    corrected: dict | None
    pitfall: str
    difficulty: int
    source: str
    lab: str | None
    file: Path
    line: int


@dataclass
class Bank:
    """The loaded bank: items in teaching order (topic order of TOPICS, then file order)."""

    dir: Path
    items: dict = field(default_factory=dict)      # id -> Item
    titles: dict = field(default_factory=dict)     # topic -> {ko, en}
    files: dict = field(default_factory=dict)      # topic -> Path
    pitfalls: dict = field(default_factory=dict)   # tag -> {ko, en}

    @property
    def topics(self):
        return list(self.titles)

    def select(self, topic_or_ids, n=None, shuffle=False, seed=None):
        """Items for a topic name, ``"all"``, or a list of ids (kept in the given order).

        ``shuffle`` reorders with ``random.Random(seed)`` before the first ``n`` are taken.
        """
        items = self._pick(topic_or_ids)
        if shuffle:
            random.Random(seed).shuffle(items)
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(items):
                raise ValueError(f"n must be a whole number from 1 to {len(items)} "
                                 f"(the number of items selected), got {n!r}")
            items = items[:n]
        return items

    def _pick(self, topic_or_ids):
        valid = ", ".join(self.topics)
        if isinstance(topic_or_ids, str):
            if topic_or_ids == "all":
                return list(self.items.values())
            if topic_or_ids in self.titles:
                return [item for item in self.items.values() if item.topic == topic_or_ids]
            if topic_or_ids in TOPICS:
                raise ValueError(f"topic {topic_or_ids!r} has no item file in {self.dir} yet; "
                                 f"topics with items: {valid}")
            raise ValueError(f"unknown topic {topic_or_ids!r}; pass one of: {valid}, 'all', "
                             "or a list of item ids")
        if not isinstance(topic_or_ids, (list, tuple)) or not topic_or_ids:
            raise ValueError(f"pass a topic name ({valid}), 'all', or a non-empty list of item ids; "
                             f"got {topic_or_ids!r}")
        ids = list(topic_or_ids)
        unknown = [str(i) for i in ids if i not in self.items]
        if unknown:
            raise ValueError(f"unknown item ids: {', '.join(unknown)} (not in {self.dir})")
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(f"item ids listed more than once: {', '.join(repeated)}")
        return [self.items[i] for i in ids]


def resolve_bank_dir(bank_dir=None):
    """``bank_dir`` argument, else ``$MPKIT_QUIZ_DIR``, else the bank shipped with the package."""
    if bank_dir is None:
        bank_dir = os.environ.get("MPKIT_QUIZ_DIR") or shipped_bank_dir()
    return Path(bank_dir)


def shipped_bank_dir():
    """The ``mpkit.quizzes`` package data: in a wheel install ``site-packages/mpkit/quizzes``, in an
    editable install the checkout's ``quizzes/``. A checkout that is only on ``sys.path`` (never
    installed) has no ``mpkit.quizzes``; its bank is the ``quizzes/`` folder beside ``mpkit/``."""
    try:
        return Path(str(importlib.resources.files("mpkit.quizzes")))  # pip installs unpacked, so a real folder
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "quizzes"


def load_bank(bank_dir=None):
    """The bank as a :class:`Bank`; raises :class:`BankError` listing every error found."""
    bank, problems = read_bank(bank_dir)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise BankError(errors)
    return bank


def read_bank(bank_dir=None):
    """Read everything that can be read; return ``(bank, problems)`` without raising on content."""
    bank = Bank(resolve_bank_dir(bank_dir))
    if not bank.dir.is_dir():
        problem = "is a file, not a folder" if bank.dir.exists() else "does not exist"
        raise FileNotFoundError(f"quiz bank folder {bank.dir} {problem}; give the folder that holds the "
                                "<topic>.yaml files: pass bank_dir= (or --bank) or set MPKIT_QUIZ_DIR")
    topic_files = sorted(p for p in bank.dir.glob("*.yaml") if p.name not in (PITFALLS_FILE, GLOSSARY_FILE))
    if not topic_files:
        raise FileNotFoundError(f"no topic files (<topic>.yaml) in quiz bank folder {bank.dir}")
    problems = []
    for stray in sorted(bank.dir.glob("*.yml")):
        problems.append(Problem(stray, None, None, "ignored: bank files must end in .yaml", "warning"))
    pitfalls = _read_pitfalls(bank.dir / PITFALLS_FILE, _Reporter(bank.dir / PITFALLS_FILE, problems))
    bank.pitfalls = pitfalls or {}
    rank = {topic: i for i, topic in enumerate(TOPICS)}
    for path in sorted(topic_files, key=lambda p: (rank.get(p.stem, len(TOPICS)), p.name)):
        _read_topic(path, bank, pitfalls, _Reporter(path, problems))
    return bank, problems


class _Reporter:
    """Collects problems for one file."""

    def __init__(self, path, problems):
        self.path, self.problems = path, problems

    def error(self, line, item_id, message):
        self.problems.append(Problem(self.path, line, item_id, message))

    def warn(self, line, item_id, message):
        self.problems.append(Problem(self.path, line, item_id, message, "warning"))

    def count(self):
        return sum(p.severity == "error" for p in self.problems)


def _compose(rep):
    """``(data, node)`` of the file, or ``(None, None)`` after reporting why it cannot be read."""
    try:
        text = rep.path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        rep.error(None, None, f"not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8")
        return None, None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        rep.error(mark.line + 1 if mark else None, None,
                  f"not valid YAML: {exc.problem or exc.context} (check indentation and quoting)")
        return None, None
    except yaml.YAMLError as exc:
        rep.error(None, None, f"not valid YAML: {exc}")
        return None, None
    finally:
        loader.dispose()
    if node is None:
        rep.error(None, None, "the file is empty")
    return data, node


def _key_lines(node, rep, item_id):
    """``{key: line}`` of a mapping node; reports keys written twice (YAML keeps only the last)."""
    lines = {}
    for key_node, _ in node.value:
        key = key_node.value
        line = key_node.start_mark.line + 1
        if key in lines:
            rep.error(line, item_id, f"key {key!r} appears twice (first on line {lines[key]}); keep one")
        lines[key] = line
    return lines


def _bilingual(value, name, rep, line, item_id):
    """``{ko, en}`` stripped, or None after reporting what is missing."""
    if value is None:
        rep.error(line, item_id, f"{name} is missing; write {name}: {{ko: ..., en: ...}}")
        return None
    if not isinstance(value, dict):
        rep.error(line, item_id, f"{name} must be a mapping {{ko: ..., en: ...}}, got {type(value).__name__}")
        return None
    ok = True
    for lang in LANGS:
        text = value.get(lang)
        if lang not in value:
            rep.error(line, item_id, f"{name}.{lang} is missing; write both ko and en")
        elif not isinstance(text, str):
            rep.error(line, item_id, f"{name}.{lang} must be text, got {text!r} (quote it)")
        elif not text.strip():
            rep.error(line, item_id, f"{name}.{lang} is empty")
        else:
            continue
        ok = False
    return {lang: value[lang].strip() for lang in LANGS} if ok else None


def _read_pitfalls(path, rep):
    if not path.exists():
        rep.error(None, None, "missing: the bank needs pitfalls.yaml with "
                              "`pitfalls: {tag: {ko: ..., en: ...}}`")
        return None
    data, node = _compose(rep)
    if node is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("pitfalls"), dict) or not data["pitfalls"]:
        rep.error(1, None, "top level must be `pitfalls:` mapping each tag to {ko: ..., en: ...}")
        return None
    pitfalls_node = next(v for k, v in node.value if k.value == "pitfalls")
    lines = _key_lines(pitfalls_node, rep, None)
    names = {}
    for tag, name in data["pitfalls"].items():
        checked = _bilingual(name, f"pitfall {tag!r}", rep, lines.get(tag), None)
        if checked:
            names[str(tag)] = checked
    return names


def _read_topic(path, bank, pitfalls, rep):
    data, node = _compose(rep)
    if node is None:
        return
    if not isinstance(data, dict):
        rep.error(1, None, "top level must be a mapping with topic, title and items")
        return
    lines = _key_lines(node, rep, None)
    topic = data.get("topic")
    if topic not in TOPICS:
        rep.error(lines.get("topic", 1), None, f"topic must be one of {', '.join(TOPICS)}; got {topic!r}")
        return
    if topic != path.stem:
        rep.error(lines["topic"], None, f"topic is {topic!r} but the file is {path.name}; "
                                        f"name the file {topic}.yaml")
        return
    title = _bilingual(data.get("title"), "title", rep, lines.get("title", 1), None)
    items = data.get("items")
    if not isinstance(items, list) or not items:
        rep.error(lines.get("items", 1), None, "items must be a non-empty list of items")
        return
    if title:
        bank.titles[topic] = title
        bank.files[topic] = path
    items_node = next(v for k, v in node.value if k.value == "items")
    for position, (raw, item_node) in enumerate(zip(items, items_node.value), start=1):
        item = _read_item(raw, item_node, position, topic, pitfalls, rep)
        if item is None:
            continue
        first = bank.items.get(item.id)
        if first is not None:
            rep.error(item.line, item.id, f"duplicate id (first defined at {first.file}:{first.line}); "
                                          "ids must be unique across the bank")
        elif title:
            bank.items[item.id] = item


def _read_item(raw, node, position, topic, pitfalls, rep):
    """An :class:`Item`, or None when this item has errors (all of them reported)."""
    line = node.start_mark.line + 1
    if not isinstance(raw, dict):
        rep.error(line, f"(item {position})", "each item must be a mapping with "
                                              + ", ".join(REQUIRED))
        return None
    errors_before = rep.count()
    item_id = raw.get("id")
    label = item_id if isinstance(item_id, str) and ID_RE.fullmatch(item_id) else f"(item {position})"
    lines = _key_lines(node, rep, label)

    def at(key):  # the line of a field, else of the item
        return lines.get(key, line)

    if label != item_id and "id" in raw:
        rep.error(at("id"), label, f"id must be text of letters, digits, '-' or '_' like 'pp-001'; "
                                   f"got {item_id!r}")
    for key in REQUIRED:
        if key not in raw:
            rep.error(line, label, f"missing required field {key!r}")
    for key in raw:
        if key not in REQUIRED and key not in OPTIONAL:
            rep.warn(at(key), label, f"unknown field {key!r} is ignored "
                                     f"(fields: {', '.join(REQUIRED + OPTIONAL)})")
    answer = raw.get("answer")
    if "answer" in raw and answer not in ANSWERS:
        hint = (" (unquoted yes/no/on/off/true/false are YAML booleans)" if isinstance(answer, bool) else "")
        rep.error(at("answer"), label, f'answer must be the capital letter O (true) or X (false); '
                                       f"got {answer!r}{hint}: write `answer: O` or `answer: X`")
    statement, explanation = (_bilingual(raw[key], key, rep, at(key), label) if key in raw else None
                              for key in ("statement", "explanation"))
    corrected = None
    if answer == "X":
        if "corrected" not in raw:
            rep.error(line, label, "answer X needs `corrected: {ko: ..., en: ...}` (the true statement)")
        else:
            corrected = _bilingual(raw["corrected"], "corrected", rep, at("corrected"), label)
    elif answer == "O" and "corrected" in raw:
        rep.warn(at("corrected"), label, "corrected is ignored for O items; remove it or check the answer")
    pitfall = raw.get("pitfall")
    if "pitfall" in raw and not isinstance(pitfall, str):
        rep.error(at("pitfall"), label, f"pitfall must be one tag from {PITFALLS_FILE} like "
                                        f"'confuses-dp-with-mp', got {pitfall!r}")
    elif "pitfall" in raw and pitfalls is not None and pitfall not in pitfalls:
        rep.error(at("pitfall"), label, f"unknown pitfall {pitfall!r}; define it in {PITFALLS_FILE} "
                                        f"or use one of: {', '.join(sorted(pitfalls))}")
    difficulty = raw.get("difficulty")
    if "difficulty" in raw and (isinstance(difficulty, bool) or difficulty not in DIFFICULTIES):
        rep.error(at("difficulty"), label, f"difficulty must be 1, 2 or 3; got {difficulty!r}")
    source = raw.get("source")
    if "source" in raw and (not isinstance(source, str) or not source.strip()):
        rep.error(at("source"), label, 'source must be non-empty text, e.g. "seed: 추가 학습 내용 2"')
    lab = raw.get("lab")
    if lab is not None and (not isinstance(lab, str) or not lab.strip()):
        rep.error(at("lab"), label, "lab must be a notebook name like 04_pipeline_parallel")
    if rep.count() > errors_before:
        return None
    return Item(id=item_id, topic=topic, statement=statement, answer=answer, explanation=explanation,
                corrected=corrected, pitfall=pitfall, difficulty=difficulty, source=source.strip(),
                lab=lab, file=rep.path, line=line)
