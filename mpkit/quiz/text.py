"""Every user-facing quiz string, in Korean and English, in one table.

Widgets, printable sheets and assignment notebooks all read from here, so a translation is
fixed in one place and the language toggle can re-render everything from ``(key, lang)``.
"""

LANGS = ("ko", "en")
LANG_LABELS = {"ko": "한국어", "en": "English"}

UI = {
    "title": {"ko": "O/X 퀴즈", "en": "O/X quiz"},
    "o_tooltip": {"ko": "O: 맞는 설명이다 (참)", "en": "O: the statement is true"},
    "x_tooltip": {"ko": "X: 틀린 설명이다 (거짓)", "en": "X: the statement is false"},
    "lang_tooltip": {"ko": "표시 언어", "en": "Display language"},
    "correct": {"ko": "✔ 정답입니다", "en": "✔ Correct"},
    "incorrect": {"ko": "✘ 오답입니다", "en": "✘ Incorrect"},
    "unanswered": {"ko": "– 답하지 않았습니다", "en": "– Not answered"},
    "your_answer": {"ko": "내 답", "en": "Your answer"},
    "right_answer": {"ko": "정답", "en": "Correct answer"},
    "selected": {"ko": "선택", "en": "Selected"},
    "explanation": {"ko": "해설", "en": "Explanation"},
    "corrected": {"ko": "바르게 고친 문장", "en": "Corrected statement"},
    "submit": {"ko": "제출", "en": "Submit"},
    "submit_tooltip": {"ko": "답안을 제출하고 채점합니다", "en": "Submit your answers for grading"},
    "score": {"ko": "점수", "en": "Score"},
    "progress": {"ko": "맞힌 문항 / 답한 문항 / 전체", "en": "correct / answered / total"},
    "pitfall": {"ko": "함정 유형", "en": "Pitfall"},
    "pitfall_result": {"ko": "맞힘 / 문항", "en": "correct / items"},
    "review_empty": {
        "ko": "복습할 문항이 없습니다. 틀린 문항이 생기면 여기에서 다시 풀 수 있어요.",
        "en": "Nothing to review yet: items you miss will come back here.",
    },
    "sheet_name": {"ko": "이름", "en": "Name"},
    "sheet_date": {"ko": "날짜", "en": "Date"},
    "sheet_instructions": {
        "ko": "각 문장이 맞으면 O, 틀리면 X에 표시하세요.",
        "en": "Mark O if the statement is true, X if it is false.",
    },
    "key_title": {"ko": "정답지", "en": "Answer key"},
}


def t(key, lang):
    """The UI string ``key`` in ``lang`` (KeyError names a missing key, which is a bug here)."""
    return UI[key][lang]


def check_lang(lang):
    """Raise a ValueError that says what to pass unless ``lang`` is a supported language."""
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {', '.join(map(repr, LANGS))}, got {lang!r}")
    return lang
