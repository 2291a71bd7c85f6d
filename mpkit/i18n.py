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
    'assign_steps': {"ko": '1. 위에서부터 차례로 모든 셀을 실행하세요. 첫 코드 셀의 `STUDENT`에 이름(또는 학번)을 적으세요.\n2. 각 문장이 맞으면 **O**, 틀리면 **X**를 누르세요.\n3. 시험 모드에서는 퀴즈마다 **제출**을 눌러야 답이 저장되고 채점됩니다.\n4. 답은 `quiz_results/` 폴더에 저장됩니다. 잠긴 셀은 고치지 마세요.', "en": '1. Run every cell from the top. Put your name (or student id) in `STUDENT` in the first code cell.\n2. Press **O** if a statement is true, **X** if it is false.\n3. In exam mode press **Submit** on each quiz: only then are answers saved and graded.\n4. Answers are saved under `quiz_results/`. Do not edit the locked cells.'},
    'score_cell': {"ko": '아래 셀은 맞힌 문항 수를 보여 줍니다. 만점', "en": 'The cell below shows how many items you got right, out of'},
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
    'all_reduce': {"ko": 'all-reduce', "en": 'all-reduce'},
    'all_gather': {"ko": 'all-gather', "en": 'all-gather'},
    'reduce_scatter': {"ko": 'reduce-scatter', "en": 'reduce-scatter'},
    'broadcast': {"ko": 'broadcast', "en": 'broadcast'},
    'reduce': {"ko": 'reduce', "en": 'reduce'},
    'barrier': {"ko": 'barrier', "en": 'barrier'},
    'all_to_all': {"ko": 'all-to-all', "en": 'all-to-all'},
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
    'activations': {"ko": '활성값', "en": 'activations'},
    'other': {"ko": '기타 (임시 텐서)', "en": 'other (temporaries)'},
    'optimizer_state': {"ko": '옵티마이저 상태', "en": 'optimizer state'},
    'memory_over_time': {"ko": '시간에 따른 메모리', "en": 'Memory over time'},
    'total': {"ko": '합계', "en": 'total'},
    'comm': {"ko": '랭크별 전송 바이트', "en": 'Bytes on the wire per rank'},
    'whole_run': {"ko": '전체 실행', "en": 'whole run'},
    'memory_legend': {"ko": '메모리', "en": 'memory'},
    'strip_legend': {"ko": '계산 (위쪽 띠)', "en": 'compute (top strip)'},
    'bytes': {"ko": '보낸 바이트 ({unit})', "en": 'bytes sent ({unit})'},
    'comm_note': {"ko": '집합 통신: 이벤트의 페이로드 S × 링 공식 (all-reduce 2(N-1)/N·S, reduce-scatter / all-gather (N-1)/N·S), N = {n}\n송신 / RPC: 이벤트에서 측정한 바이트 (수신은 보낸 쪽에서 집계)', "en": 'collectives: payload S from the event × ring formula (all-reduce 2(N-1)/N·S, reduce-scatter / all-gather (N-1)/N·S), N = {n}\nsend / rpc: bytes measured on the event (recv counts at its sender)'},
    'formula': {"ko": '빗금: 링 공식', "en": 'hatched: ring formula'},
    'measured': {"ko": '단색: 측정값', "en": 'solid: measured'},
    'ring_reference': {"ko": '링 all-reduce 2(N-1)/N·S, S = {size}', "en": 'ring all-reduce 2(N-1)/N·S for S = {size}'},
    'no_comm': {"ko": '이 실행에는 통신이 없습니다', "en": 'no communication in this run'},
    'bubble_title': {"ko": '마이크로배치 수에 따른 파이프라인 버블 (p = {p}{v})', "en": 'Pipeline bubble vs micro-batches (p = {p}{v})'},
    'bubble_x': {"ko": '스텝당 마이크로배치 수 m', "en": 'micro-batches per step m'},
    'bubble_y': {"ko": '버블 (스텝 중 유휴 비율)', "en": 'bubble (idle share of the step)'},
    'bubble_formula': {"ko": '공식 (p-1)/(m+p-1)', "en": 'formula (p-1)/(m+p-1)'},
    'bubble_formula_v': {"ko": '공식 (p-1)/(v·m+p-1)', "en": 'formula (p-1)/(v·m+p-1)'},
    'bubble_measured': {"ko": '측정값 (트레이스)', "en": 'measured (trace)'},
    'bubble_mp': {"ko": 'm = 1: 레이어 단위 모델 병렬, (p-1)/p', "en": 'm = 1: layer-wise MP, (p-1)/p'},
    'breakdown_compute': {"ko": '계산', "en": 'compute'},
    'breakdown_comm': {"ko": '통신 (가려지지 않은 부분)', "en": 'communication (not hidden)'},
    'breakdown_bubble': {"ko": '버블 (유휴)', "en": 'bubble (idle)'},
    'breakdown_title': {"ko": '예측한 스텝 시간', "en": 'Predicted step time'},
    'breakdown_xlabel': {"ko": '옵티마이저 스텝당 시간 (ms)', "en": 'time per optimizer step (ms)'},
    # ---- plot.collectives ----
    'collectives_title': {"ko": '집합 통신 여섯 가지: 랭크 {n}개가 가진 값, 전과 후 (색 = 값이 온 랭크, 진한 칸 = 모든 랭크의 합)', "en": 'The six collectives: what {n} ranks hold before and after (colour = the rank a value came from, dark = the sum over all ranks)'},
    'before': {"ko": '전', "en": 'before'},
    'after': {"ko": '후', "en": 'after'},
    'undefined': {"ko": '정해지지 않음', "en": 'undefined'},
    'sent_per_rank': {"ko": '랭크당 송신', "en": 'sent per rank'},
    # ---- mpkit tour ----
    'tour_header': {"ko": 'mpkit tour: 시뮬레이션 장치 {n}개, {model} 레이어 {layers}개, 배치 {batch}, {steps} 스텝 (pp: 마이크로배치 {m}개)', "en": 'mpkit tour: {n} simulated devices, {model} with {layers} layers, batch {batch}, {steps} steps (pp: {m} micro-batches)'},
    'tour_strategy': {"ko": '전략', "en": 'strategy'},
    'tour_ranks': {"ko": '랭크', "en": 'ranks'},
    'tour_loss': {"ko": '마지막 손실', "en": 'final loss'},
    'tour_diff': {"ko": 'single과의 최대 차이', "en": 'max diff vs single'},
    'tour_peak': {"ko": '랭크별 최대 MiB', "en": 'peak MiB per rank'},
    'tour_bubble': {"ko": '버블', "en": 'bubble'},
    'tour_comm': {"ko": '통신', "en": 'comm'},
    'tour_time': {"ko": '시간', "en": 'time'},
    'tour_error': {"ko": '오류', "en": 'error'},
    'tour_caveat': {"ko": '주의: 시뮬레이션 장치 시간입니다. 레이어마다 마이크로배치 하나의 순전파에서 {ms:g} ms(역전파는 그 두 배) 동안 잠들어 장치의 계산 시간을 대신하므로, 랭크마다 전용 장치가 있는 것처럼 동작합니다. 이 시간은 배치·마이크로배치 크기나 텐서 분할과 상관없이 같으므로 시간 열은 속도 향상을 보여 주지 않습니다. 읽을 것은 결과 일치(차이), 랭크별 메모리, 버블(스텝의 첫 순전파부터 마지막 역전파까지 계산하지 않은 시간의 비율, 스텝 1 이후의 중앙값)입니다. pp(마이크로배치 {m}개)의 버블은 공식 (p-1)/(m+p-1)에 가깝고 mp의 (p-1)/p보다 훨씬 작습니다 (04번 실습). 실제 하드웨어의 시간은 mpkit.sim.predict로 예측하세요.', "en": 'Caveat: this is simulated device time. Every layer sleeps {ms:g} ms per micro-batch forward (twice that backward) in place of device work, so every rank behaves like a dedicated device. That time is the same whatever the batch, micro-batch or tensor split, so the time column shows no speed-up. Read parity (diff), memory per rank and the bubble (the idle share of a step from its first forward to its last backward, median over the steps after step 0): pp with {m} micro-batches sits near the formula (p-1)/(m+p-1), far below mp\'s (p-1)/p (lab 04). For times on real hardware use mpkit.sim.predict.'},
    'tour_plots': {"ko": '그림: {out}/ 에 PNG {n}개', "en": 'plots: {n} PNGs in {out}/'},
    # ---- plot.staleness ----
    'staleness_title': {"ko": '파라미터 서버 (비동기): 적용된 업데이트마다의 손실', "en": 'Parameter server (async): loss of each applied update'},
    'staleness_loss': {"ko": '손실', "en": 'loss'},
    'staleness_update': {"ko": '파라미터 서버에 적용된 업데이트 순서', "en": 'order in which the server applied the updates'},
    'staleness_stale': {"ko": '지연(staleness)', "en": 'staleness'},
    'staleness_stale_title': {"ko": '그 사이 다른 워커가 먼저 적용한 업데이트 수', "en": 'updates other workers applied in between'},
    'staleness_rank': {"ko": '랭크 {n}', "en": 'rank {n}'},
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
