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
    "assign_steps": {
        "ko": "1. 위에서부터 차례로 모든 셀을 실행하세요. 첫 코드 셀의 `STUDENT`에 이름(또는 학번)을 적으세요.\n"
              "2. 각 문장이 맞으면 **O**, 틀리면 **X**를 누르세요.\n"
              "3. 시험 모드에서는 퀴즈마다 **제출**을 눌러야 답이 저장되고 채점됩니다.\n"
              "4. 답은 `quiz_results/` 폴더에 저장됩니다. 잠긴 셀은 고치지 마세요.",
        "en": "1. Run every cell from the top. Put your name (or student id) in `STUDENT` in the first "
              "code cell.\n"
              "2. Press **O** if a statement is true, **X** if it is false.\n"
              "3. In exam mode press **Submit** on each quiz: only then are answers saved and graded.\n"
              "4. Answers are saved under `quiz_results/`. Do not edit the locked cells.",
    },
    "score_cell": {"ko": "아래 셀은 맞힌 문항 수를 보여 줍니다. 만점",
                   "en": "The cell below shows how many items you got right, out of"},
}


def t(key, lang):
    """The UI string ``key`` in ``lang`` (KeyError names a missing key, which is a bug here)."""
    return UI[key][lang]


def check_lang(lang):
    """Raise a ValueError that says what to pass unless ``lang`` is a supported language."""
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {', '.join(map(repr, LANGS))}, got {lang!r}")
    return lang
