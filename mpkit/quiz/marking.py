"""The one marking rule, shared by ``mpkit quiz grade`` and nbgrader autograde.

An item's graded answer is the **first** one recorded for it. Every recorded answer was given
with the key shown at once (drill) or shown right after it (exam Submit, which also records the
items left blank), so anything recorded later is a retake after seeing the key: it is reported,
never rewarded. Correctness is always recomputed from the key, never read from a submission.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Mark:
    item_id: str
    key: str          # "O" or "X"
    given: str        # the graded (first) answer: "O", "X", or "" (never answered, or left blank)
    attempts: int     # how many answers were recorded, blanks included
    last: str         # the latest recorded answer ("" when blank or none)

    @property
    def correct(self):
        return self.given == self.key

    @property
    def retaken(self):
        """Answered again after the key was shown (the later answers did not count)."""
        return self.attempts > 1


def mark(key, answers):
    """One :class:`Mark` per item of ``key`` (item id -> "O"/"X"), in key order, from ``answers``
    (item id -> recorded answers in order, None for blank); answers to other items are ignored."""
    marks = []
    for item_id, right in key.items():
        recorded = answers.get(item_id, [])
        marks.append(Mark(item_id, right, given=(recorded[0] or "") if recorded else "",
                          attempts=len(recorded), last=(recorded[-1] or "") if recorded else ""))
    return marks
