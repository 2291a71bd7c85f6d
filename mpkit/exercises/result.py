"""What a check says: one result per case (a sub-check worth its own points), in Korean and English.

A case names what it ran ("4 ranks, 10 elements"); a failing one says which rank and which tensor
or step, expected against got with the largest difference, and the hint for the mistake the
checker recognised. ``CheckResult.message`` is what the learner reads; ``passed`` what a grader
asserts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mpkit.i18n import check_lang


@dataclass
class Text:
    """One sentence in both languages."""
    ko: str
    en: str

    def __call__(self, lang: str) -> str:
        return self.ko if check_lang(lang) == "ko" else self.en

    def __add__(self, other: "Text") -> "Text":
        return Text(f"{self.ko} {other.ko}".strip(), f"{self.en} {other.en}".strip())


@dataclass
class CaseResult:
    name: Text
    passed: bool
    detail: Text = field(default_factory=lambda: Text("", ""))
    hint: Text | None = None   # the recognised mistake, when there is one

    def message(self, lang: str) -> str:
        mark = "✔" if self.passed else "✘"
        text = f"{mark} {self.name(lang)}"
        if self.detail(lang):
            text += f": {self.detail(lang)}"
        if self.hint is not None:
            text += f"\n    {'힌트' if lang == 'ko' else 'hint'}: {self.hint(lang)}"
        return text


@dataclass
class CheckResult:
    """All cases of one exercise. ``passed`` only when every case passed; ``score`` counts them."""
    exercise: str
    lang: str
    cases: list[CaseResult]
    not_done: bool = False   # the stub was left as it is: nothing was run

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(case.passed for case in self.cases)

    @property
    def score(self) -> tuple[int, int]:
        return sum(case.passed for case in self.cases), len(self.cases)

    def case(self, index: int) -> CaseResult:
        """The ``index``-th case (what an autograder cell asserts, one cell per case)."""
        return self.cases[index]

    @property
    def message(self) -> str:
        lang = self.lang
        if self.not_done:
            return (f"{self.exercise}: 아직 풀지 않았습니다. 함수를 채운 뒤 다시 확인하세요." if lang == "ko" else
                    f"{self.exercise}: not done yet. Fill in the function, then check again.")
        done, total = self.score
        head = (f"{self.exercise}: {total}개 중 {done}개 통과" if lang == "ko" else
                f"{self.exercise}: {done} of {total} checks passed")
        if self.passed:
            head += " — 모두 맞았습니다!" if lang == "ko" else " — all correct!"
        return "\n".join([head] + [case.message(lang) for case in self.cases])

    def __str__(self):
        return self.message

    def __repr__(self):
        return self.message
