"""Every user-facing string of the package, in Korean and English, in one table.

Quiz widgets, printable sheets, assignment notebooks and plots all read from here, so a
translation is fixed in one place, a language toggle re-renders everything from ``(key, lang)``,
and one ``check_lang`` says what to pass.
"""
from __future__ import annotations

LANGS = ("ko", "en")
LANG_LABELS = {"ko": "한국어", "en": "English"}

STRINGS = {
    # ---- quiz widget, sheets and assignment notebooks ----
    'title': {"ko": 'O/X 퀴즈', "en": 'O/X quiz'},
    'o_tooltip': {"ko": 'O: 맞는 설명이다 (참)', "en": 'O: the statement is true'},
    'x_tooltip': {"ko": 'X: 틀린 설명이다 (거짓)', "en": 'X: the statement is false'},
    'lang_tooltip': {"ko": '표시 언어', "en": 'Display language'},
    'correct': {"ko": '✔ 정답입니다', "en": '✔ Correct'},
    'incorrect': {"ko": '✘ 오답입니다', "en": '✘ Incorrect'},
    'unanswered': {"ko": '– 답하지 않았습니다', "en": '– Not answered'},
    'your_answer': {"ko": '내 답', "en": 'Your answer'},
    'right_answer': {"ko": '정답', "en": 'Correct answer'},
    'selected': {"ko": '선택', "en": 'Selected'},
    'explanation': {"ko": '해설', "en": 'Explanation'},
    'corrected': {"ko": '바르게 고친 문장', "en": 'Corrected statement'},
    'submit': {"ko": '제출', "en": 'Submit'},
    'submit_tooltip': {"ko": '답안을 제출하고 채점합니다', "en": 'Submit your answers for grading'},
    'score': {"ko": '점수', "en": 'Score'},
    'progress': {"ko": '맞힌 문항 / 답한 문항 / 전체', "en": 'correct / answered / total'},
    'pitfall': {"ko": '함정 유형', "en": 'Pitfall'},
    'pitfall_result': {"ko": '맞힘 / 문항', "en": 'correct / items'},
    'review_empty': {"ko": '복습할 문항이 없습니다. 틀린 문항이 생기면 여기에서 다시 풀 수 있어요.', "en": 'Nothing to review yet: items you miss will come back here.'},
    'sheet_name': {"ko": '이름', "en": 'Name'},
    'sheet_date': {"ko": '날짜', "en": 'Date'},
    'sheet_instructions': {"ko": '각 문장이 맞으면 O, 틀리면 X에 표시하세요.', "en": 'Mark O if the statement is true, X if it is false.'},
    'key_title': {"ko": '정답지', "en": 'Answer key'},
    'assign_steps': {"ko": '1. 위에서부터 모든 셀을 실행하세요(메뉴 Run → Run All Cells). 따로 입력할 것은 없습니다.\n2. 각 문장이 맞으면 **O**, 틀리면 **X**를 누르세요. 시험 모드에서는 퀴즈마다 **제출**을 누르세요.\n3. 정답이 공개된 뒤(연습 모드는 답하는 즉시, 시험 모드는 제출 후)에 다시 풀어도 **처음 답**으로 채점됩니다.\n4. 끝나면 **마지막 셀(답안 제출)을 다시 실행**하고 노트북을 저장(Ctrl+S)한 뒤 제출하세요. 답은 그 셀의 출력으로 노트북에 담겨 채점됩니다. 잠긴 셀은 고치지 마세요.', "en": '1. Run every cell from the top (Run → Run All Cells). There is nothing to type.\n2. Press **O** if a statement is true, **X** if it is false. In exam mode press **Submit** on each quiz.\n3. Once the key has been shown (drill: as you answer; exam: after Submit), answering again does not change your grade: your **first answers** are graded.\n4. When you are done, **run the last cell (hand-in) again**, save the notebook (Ctrl+S) and submit it. Your answers travel inside the notebook as that cell\'s output. Do not edit the locked cells.'},
    'hand_in': {"ko": '답안 제출', "en": 'Hand-in'},
    'hand_in_steps': {"ko": '모든 퀴즈를 푼 뒤 아래 셀을 **다시 실행**하고 저장하세요. 답이 이 셀의 출력으로 노트북에 담기며, 그것이 채점됩니다. 만점', "en": 'After answering every quiz, **run the cell below again** and save. Your answers go into the notebook as its output, and that is what gets graded. Points:'},
    'sheet_title': {"ko": '답안지', "en": 'Answer sheet'},
    'sheet_item': {"ko": '문항', "en": 'item'},
    'sheet_graded': {"ko": '채점할 답 (처음 답)', "en": 'graded answer (first)'},
    'sheet_later': {"ko": '그 뒤의 답 (채점 안 함)', "en": 'later answers (not graded)'},
    'sheet_key': {"ko": '정답', "en": 'key'},
    'sheet_answered': {"ko": '{total}문항 중 {answered}문항에 답함', "en": 'answered {answered} of {total} items'},
    'sheet_score': {"ko": '점수 {correct}/{total}', "en": 'score {correct}/{total}'},
    'sheet_retakes': {"ko": '정답 공개 뒤 다시 푼 문항 {n}개는 처음 답으로 채점했습니다', "en": '{n} item(s) answered again after the key was shown: graded on the first answer'},
    'sheet_unsubmitted': {"ko": '답을 고르고 아직 제출하지 않은 퀴즈가 {n}개 있습니다. 제출을 누른 뒤 이 셀을 다시 실행하세요.', "en": '{n} quiz(zes) have answers chosen but not submitted: press Submit, then run this cell again.'},
    'sheet_saved': {"ko": '이 셀을 실행한 뒤 노트북을 저장하고 제출하세요.', "en": 'Now save the notebook and submit it.'},
    'no_sheet': {"ko": '노트북에 답안지가 없습니다: 저장하기 전에 답안 제출 셀을 실행하지 않았습니다', "en": 'no answer sheet in the notebook: the hand-in cell was not run before saving'},
    'saved_in': {"ko": '퀴즈 답안 저장 위치: {path} (다른 폴더를 쓰려면 MPKIT_RESULTS_DIR를 설정하세요)', "en": 'Quiz answers are saved in {path} (set MPKIT_RESULTS_DIR to use another folder)'},
    # ---- plots ----
    'timeline': {"ko": '타임라인', "en": 'Timeline'},
    'step': {"ko": '스텝 {step}', "en": 'step {step}'},
    'shares': {"ko": '버블 비율 {bubble:.1%} · 통신 비율 {comm:.1%}', "en": 'bubble share {bubble:.1%} · comm share {comm:.1%}'},
    'time_ms': {"ko": '시간 (ms)', "en": 'time (ms)'},
    'rank': {"ko": '랭크 {rank}', "en": 'rank {rank}'},
    'ranks': {"ko": '랭크', "en": 'rank'},
    'idle': {"ko": '유휴 (버블)', "en": 'idle (bubble)'},
    'ideal': {"ko": '예측', "en": 'predicted'},
    'forward': {"ko": '순전파', "en": 'forward'},
    'backward': {"ko": '역전파', "en": 'backward'},
    'optimizer': {"ko": '옵티마이저 스텝', "en": 'optimizer step'},
    'compute': {"ko": '계산', "en": 'compute'},
    'send': {"ko": '송신', "en": 'send'},
    'recv': {"ko": '수신 (대기 포함)', "en": 'recv (incl. waiting)'},
    'all_reduce': {"ko": '올리듀스', "en": 'all-reduce'},
    'all_gather': {"ko": '올개더', "en": 'all-gather'},
    'reduce_scatter': {"ko": '리듀스-스캐터', "en": 'reduce-scatter'},
    'broadcast': {"ko": '브로드캐스트', "en": 'broadcast'},
    'reduce': {"ko": '리듀스', "en": 'reduce'},
    'barrier': {"ko": '배리어', "en": 'barrier'},
    'all_to_all': {"ko": '올투올', "en": 'all-to-all'},
    'rpc': {"ko": 'RPC', "en": 'rpc'},
    'wait': {"ko": '대기', "en": 'wait'},
    'memory': {"ko": '랭크별 메모리', "en": 'Memory per rank'},
    'memory_max': {"ko": '실행 중 범주별 최댓값', "en": 'largest value of each category during the run'},
    'memory_peak': {"ko": '최대 사용 시점의 구성', "en": 'breakdown at the peak'},
    'memory_final': {"ko": '실행 종료 시점', "en": 'at the end of the run'},
    'mib': {"ko": '메모리 (MiB)', "en": 'memory (MiB)'},
    'peak_total': {"ko": '최대 합계 (막대 위 숫자)', "en": 'peak total (number above the bar)'},
    'capacity': {"ko": '장치 용량', "en": 'device capacity'},
    'parameters': {"ko": '파라미터', "en": 'parameters'},
    'gradients': {"ko": '그래디언트', "en": 'gradients'},
    'activations': {"ko": '활성화', "en": 'activations'},
    'other': {"ko": '기타 (임시 텐서)', "en": 'other (temporaries)'},
    'optimizer_state': {"ko": '옵티마이저 상태', "en": 'optimizer state'},
    'memory_over_time': {"ko": '시간에 따른 메모리', "en": 'Memory over time'},
    'total': {"ko": '합계', "en": 'total'},
    'comm': {"ko": '랭크별 전송 바이트', "en": 'Bytes on the wire per rank'},
    'whole_run': {"ko": '전체 실행', "en": 'whole run'},
    'memory_legend': {"ko": '메모리', "en": 'memory'},
    'strip_legend': {"ko": '계산 (위쪽 띠)', "en": 'compute (top strip)'},
    'bytes': {"ko": '보낸 바이트 ({unit})', "en": 'bytes sent ({unit})'},
    'comm_note': {"ko": '집합 통신: 이벤트의 페이로드 S × 링 공식 (올리듀스 2(N-1)/N·S, 리듀스-스캐터 / 올개더 (N-1)/N·S), N = {n}\n송신 / RPC: 이벤트에서 측정한 바이트 (수신은 보낸 쪽에서 집계)', "en": 'collectives: payload S from the event × ring formula (all-reduce 2(N-1)/N·S, reduce-scatter / all-gather (N-1)/N·S), N = {n}\nsend / rpc: bytes measured on the event (recv counts at its sender)'},
    'formula': {"ko": '빗금: 링 공식', "en": 'hatched: ring formula'},
    'measured': {"ko": '단색: 측정값', "en": 'solid: measured'},
    'ring_reference': {"ko": '링 올리듀스 2(N-1)/N·S, S = {size}', "en": 'ring all-reduce 2(N-1)/N·S for S = {size}'},
    'no_comm': {"ko": '이 실행에는 통신이 없습니다', "en": 'no communication in this run'},
    'bubble_title': {"ko": '마이크로배치 수에 따른 파이프라인 버블 (p = {p}{v})', "en": 'Pipeline bubble vs micro-batches (p = {p}{v})'},
    'bubble_x': {"ko": '스텝당 마이크로배치 수 m', "en": 'micro-batches per step m'},
    'bubble_y': {"ko": '버블 (스텝 중 유휴 비율)', "en": 'bubble (idle share of the step)'},
    'bubble_formula': {"ko": '공식 (p-1)/(m+p-1)', "en": 'formula (p-1)/(m+p-1)'},
    'bubble_formula_v': {"ko": '공식 (p-1)/(v·m+p-1)', "en": 'formula (p-1)/(v·m+p-1)'},
    'bubble_measured': {"ko": '측정값 (트레이스)', "en": 'measured (trace)'},
    'bubble_mp': {"ko": 'm = 1: 레이어 단위 MP, (p-1)/p', "en": 'm = 1: layer-wise MP, (p-1)/p'},
    'breakdown_compute': {"ko": '계산', "en": 'compute'},
    'breakdown_comm': {"ko": '통신 (가려지지 않은 부분)', "en": 'communication (not hidden)'},
    'breakdown_bubble': {"ko": '버블 (유휴)', "en": 'bubble (idle)'},
    'breakdown_title': {"ko": '예측한 스텝 시간', "en": 'Predicted step time'},
    'breakdown_xlabel': {"ko": '옵티마이저 스텝당 시간 (ms)', "en": 'time per optimizer step (ms)'},
    # ---- plot.staleness ----
    'staleness_title': {"ko": '파라미터 서버 (비동기): 적용된 업데이트마다의 손실', "en": 'Parameter server (async): loss of each applied update'},
    'staleness_loss': {"ko": '손실', "en": 'loss'},
    'staleness_update': {"ko": '파라미터 서버에 적용된 업데이트 순서', "en": 'order in which the server applied the updates'},
    'staleness_stale': {"ko": '지연(staleness)', "en": 'staleness'},
    'staleness_stale_title': {"ko": '그 사이 다른 워커가 먼저 적용한 업데이트 수', "en": 'updates other workers applied in between'},
    'staleness_rank': {"ko": 'rank {n}', "en": 'rank {n}'},
    'staleness_worker': {"ko": '워커 {n}', "en": 'worker {n}'},
    'staleness_mean': {"ko": '이동 평균 (업데이트 {n}개)', "en": 'running mean ({n} updates)'},
}


def check_lang(lang) -> str:
    """``lang`` if supported, else a ValueError that says what to pass."""
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {', '.join(map(repr, LANGS))}, got {lang!r}")
    return lang


def t(key: str, lang: str, **values) -> str:
    """The ``lang`` string for ``key``, formatted with ``values`` (KeyError names a missing key: a bug)."""
    text = STRINGS[key][check_lang(lang)]
    return text.format(**values) if values else text


__all__ = ["LANGS", "LANG_LABELS", "STRINGS", "check_lang", "t"]
