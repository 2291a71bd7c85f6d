"""Review the item bank before students see it: ``mpkit quiz lint``.

Lint reports every loading error (the same reader as :func:`mpkit.quiz.bank.load_bank`), plus
the quality checks that do not stop a quiz from running: statements written twice, topics with
no file yet, the O/X balance per topic (a topic that is mostly O can be passed by answering
O every time), words the glossary says to avoid (``glossary.yaml`` beside the items), and
items that lean on "the plot above" although every item is also drawn outside its lab (the
lab 09 exam, ``quiz.show("all")``, ``quiz sheet``, ``quiz assign``): that one is an error.
"""
import re
from dataclasses import dataclass

from mpkit.quiz import glossary
from mpkit.quiz.bank import TOPICS, Problem, read_bank
from mpkit.i18n import LANGS

# "위 그래프", "위의 타임라인", "위 실행", "above": words that only make sense next to a lab's output
ABOVE = {"ko": re.compile(r"(?<![\uac00-\ud7a3])위(?:의)?\s+(?:\S+\s+){0,3}?(?:그래프|그림|타임라인|표|실행|출력|측정)"),
         "en": re.compile(r"\babove\b", re.I)}
TEXT_FIELDS = ("statement", "explanation", "corrected")

BALANCE = (0.35, 0.65)  # allowed share of O answers per topic


@dataclass
class LintReport:
    """Problems (errors and warnings) and ``balance``: topic -> (count of O, count of X)."""

    bank_dir: object
    problems: list
    balance: dict

    @property
    def errors(self):
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self):
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def ok(self):
        return not self.errors

    def format(self):
        """The plain-text report ``mpkit quiz lint`` prints."""
        lines = []
        for title, group in (("errors", self.errors), ("warnings", self.warnings)):
            if group:
                lines.append(f"{title} ({len(group)}):")
                lines.extend(f"  {p}" for p in group)
        lines.append(f"O/X balance per topic (O share should be {BALANCE[0]:.0%}-{BALANCE[1]:.0%}):")
        lines.append(f"  {'topic':<16} {'items':>5} {'O':>4} {'X':>4} {'O share':>8}")
        for topic, (o, x) in self.balance.items():
            if not o + x:  # every item of the topic has errors (listed above)
                lines.append(f"  {topic:<16} {0:>5} {0:>4} {0:>4} {'-':>8}")
                continue
            flag = "" if _balanced(o, x) else "  <- unbalanced"
            lines.append(f"  {topic:<16} {o + x:>5} {o:>4} {x:>4} {o / (o + x):>8.0%}{flag}")
        lines.append(f"{len(self.errors)} errors, {len(self.warnings)} warnings in {self.bank_dir}")
        return "\n".join(lines)


def _balanced(o, x):
    return BALANCE[0] <= o / (o + x) <= BALANCE[1]


def lint(bank_dir=None):
    """Check the bank at ``bank_dir`` (default as for load_bank) and return a :class:`LintReport`."""
    bank, problems = read_bank(bank_dir)
    problems.extend(_duplicate_statements(bank))
    problems.extend(_leans_on_the_lab(bank))
    problems.extend(_vocabulary(bank))
    balance = {}
    for topic in bank.topics:
        answers = [item.answer for item in bank.items.values() if item.topic == topic]
        balance[topic] = (answers.count("O"), answers.count("X"))
        if answers and not _balanced(*balance[topic]):
            problems.append(Problem(bank.files[topic], None, None,
                                    f"O/X balance: {balance[topic][0]} O vs {balance[topic][1]} X; "
                                    f"keep the O share within {BALANCE[0]:.0%}-{BALANCE[1]:.0%}",
                                    "warning"))
    for topic in TOPICS:
        if topic not in bank.titles and not (bank.dir / f"{topic}.yaml").exists():
            problems.append(Problem(bank.dir / f"{topic}.yaml", None, None,
                                    "no item file for this topic yet", "warning"))
    return LintReport(bank.dir, problems, balance)


def _duplicate_statements(bank):
    """Statements equal after collapsing whitespace and case, per language, across the bank."""
    seen = {}
    for item in bank.items.values():
        for lang in LANGS:
            key = (lang, " ".join(item.statement[lang].split()).casefold())
            first = seen.setdefault(key, item)
            if first is not item:
                yield Problem(item.file, item.line, item.id,
                              f"statement.{lang} duplicates {first.id} ({first.file}:{first.line}); "
                              "reword one of them or drop it")


def _texts(item):
    for field in TEXT_FIELDS:
        value = getattr(item, field)
        for lang in LANGS:
            if value:
                yield f"{field}.{lang}", lang, value[lang]


def _leans_on_the_lab(bank):
    """Items that point at "the plot above": every item is also drawn where there is no plot."""
    for item in bank.items.values():
        for where, lang, text in _texts(item):
            match = ABOVE[lang].search(text)
            if match:
                lab = f" (lab: {item.lab})" if item.lab else ""
                yield Problem(item.file, item.line, item.id,
                              f"{where} says {match.group(0)!r}{lab}, but items are also drawn outside "
                              "their lab (exam, quiz sheet, quiz assign): state what the lab shows "
                              "instead of pointing at it")


def _vocabulary(bank):
    """Words the bank's glossary says to avoid; a missing or broken glossary is reported once."""
    path = bank.dir / glossary.GLOSSARY_FILE
    if not path.exists():
        yield Problem(path, None, None, "no glossary in the bank: vocabulary not checked", "warning")
        return
    try:
        terms = glossary.load(path)
    except ValueError as exc:
        yield Problem(path, None, None, str(exc))
        return
    for item in bank.items.values():
        for where, lang, text in _texts(item):
            for variant in glossary.variants(text, lang, terms):
                yield Problem(item.file, item.line, item.id, f"{where} {variant}", "warning")
