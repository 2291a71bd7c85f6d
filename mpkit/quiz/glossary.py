"""The one bilingual vocabulary (``quizzes/glossary.yaml``) and the checks that keep text to it.

Labs, items and widgets show their words side by side, so one concept must have one Korean and
one English term. :func:`load` reads the glossary; :func:`variants` finds the words it says to
avoid (quoted text and code are left out, so a seed term can still be quoted);
:func:`missing_parentheses` finds Korean terms whose first use in a notebook does not carry the
English term in parentheses. ``mpkit quiz lint`` warns on variants in items;
``tests/test_glossary.py`` applies both checks to the labs' markdown and the i18n strings.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from mpkit.i18n import LANGS
from mpkit.quiz.bank import GLOSSARY_FILE

HANGUL = re.compile(r"[\uac00-\ud7a3]")
# What is not the author's own wording: fenced and inline code, "quoted" and “quoted” text
# (seed terms, messages), block quotes, HTML tags.
_UNQUOTED = [re.compile(r"```.*?```", re.S)] + [re.compile(p, re.M) for p in
             (r"`[^`\n]*`", r'"[^"\n]*"', r"“[^”\n]*”", r"^[ \t]*>.*$", r"<[^>\n]*>")]


@dataclass(frozen=True)
class Term:
    """One concept: its Korean and English term and the variants to avoid (compiled, per language)."""

    ko: str
    en: str
    avoid: dict

    @property
    def needs_parentheses(self):
        """A Korean word (not an English operation name): its first use carries ``(en)``."""
        return HANGUL.search(self.ko) is not None

    def advice(self, lang):
        return f"write {self.ko} ({self.en})" if lang == "ko" else f"write {self.en!r}"


@dataclass(frozen=True)
class Variant:
    """A word the glossary says to avoid, found in some text."""

    term: Term
    lang: str
    found: str

    def __str__(self):
        return f"uses {self.found!r}: {self.term.advice(self.lang)}"


def load(path) -> list[Term]:
    """The terms of the glossary file at ``path``; ValueError says what is wrong with it."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({exc})") from None
    entries = data.get("terms") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: needs `terms:`, a list of {{ko: ..., en: ..., avoid: {{ko: [...], en: [...]}}}}")
    terms = []
    for n, entry in enumerate(entries, start=1):
        where = f"{path}: term {n}"
        if not isinstance(entry, dict) or not all(isinstance(entry.get(lang), str) and entry[lang].strip()
                                                  for lang in LANGS):
            raise ValueError(f"{where}: needs non-empty text for both ko and en, got {entry!r}")
        avoid = entry.get("avoid") or {}
        if not isinstance(avoid, dict) or set(avoid) - set(LANGS):
            raise ValueError(f"{where} ({entry['ko']}): avoid must map ko/en to lists of patterns")
        compiled = {}
        for lang in LANGS:
            patterns = avoid.get(lang) or []
            try:
                compiled[lang] = tuple(re.compile(p) for p in patterns)
            except (re.error, TypeError) as exc:
                raise ValueError(f"{where} ({entry['ko']}): bad avoid.{lang} pattern: {exc}") from None
        terms.append(Term(entry["ko"].strip(), entry["en"].strip(), compiled))
    return terms


def unquoted(text: str) -> str:
    """``text`` without code, quotations, block quotes and HTML tags (each replaced by a space)."""
    for pattern in _UNQUOTED:
        text = pattern.sub(" ", text)
    return text


def korean_segments(text: str) -> list[str]:
    """The Korean parts of bilingual text: lines, table cells and ``ko / en`` halves that hold Hangul."""
    pieces = (part for line in text.splitlines() for cell in line.split("|") for part in cell.split(" / "))
    return [part for part in pieces if HANGUL.search(part)]


def variants(text: str, lang: str, terms) -> list[Variant]:
    """Every avoided word in ``text`` (written in ``lang``), outside code and quotations."""
    text = unquoted(text)
    if lang == "ko":  # English glosses in parentheses, "랭크(rank)", are the rule, not a variant
        text = "\n".join(korean_segments(re.sub(r"\([^()가-힣]*\)", " ", text)))
    return [Variant(term, lang, match.group(0)) for term in terms for pattern in term.avoid[lang]
            for match in pattern.finditer(text)]


def missing_parentheses(korean_text: str, terms) -> list[Term]:
    """Korean terms whose first use in ``korean_text`` is not followed by ``(<English term>``.

    Headings, code and quotations do not count as uses. A use inside a longer term (파라미터 in
    파라미터 서버) is that longer term's use, not this one's.
    """
    text = "\n".join(line for line in unquoted(korean_text).splitlines() if not line.lstrip().startswith("#"))
    missing = []
    for term in terms:
        if not term.needs_parentheses:
            continue
        masked = text
        for longer in terms:
            if longer is not term and term.ko in longer.ko:
                masked = masked.replace(longer.ko, "\0" * len(longer.ko))
        first = masked.find(term.ko)
        if first < 0:
            continue
        after = re.match(r"\**\s*\(\s*([^)]*)", masked[first + len(term.ko):])
        if not after or not after.group(1).lower().startswith(term.en.lower()):
            missing.append(term)
    return missing


__all__ = ["GLOSSARY_FILE", "Term", "Variant", "load", "unquoted", "korean_segments", "variants",
           "missing_parentheses"]
