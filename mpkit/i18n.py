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
    # ---- sim.plan (layout planner) ----
    'plan_header': {"ko": '{model}, {hw}의 GPU {gpus}개, 전역 배치 {batch} 시퀀스({tokens:,} 토큰): 메모리에 맞는 배치 {fit}개, 맞지 않는 배치 {dropped}개 ({seconds:.2f}초에 계산)', "en": '{model} on {gpus} GPUs of {hw}, global batch {batch} sequences ({tokens:,} tokens): {fit} layouts fit, {dropped} do not ({seconds:.2f} s to plan)'},
    'plan_col_rank': {"ko": '순위', "en": '#'},
    'plan_col_micro': {"ko": '마이크로배치', "en": 'micro-batches'},
    'plan_col_schedule': {"ko": '스케줄', "en": 'schedule'},
    'plan_col_recompute': {"ko": '재계산', "en": 'recompute'},
    'plan_col_step': {"ko": '스텝(초)', "en": 'step s'},
    'plan_col_tokens': {"ko": '토큰/초', "en": 'tokens/s'},
    'plan_col_bubble': {"ko": '버블', "en": 'bubble'},
    'plan_col_comm': {"ko": '통신', "en": 'comm'},
    'plan_col_memory': {"ko": 'GPU당 GB', "en": 'GB/GPU'},
    'plan_dropped': {"ko": '메모리에 맞지 않아 뺀 배치 {n}개; 가장 가까운 것: {layout} — {why}', "en": '{n} layouts do not fit in memory; the closest: {layout} — {why}'},
    'plan_skipped': {"ko": '건너뛴 조합 {n}개: {reason}', "en": '{n} combinations skipped: {reason}'},
    'plan_skip_dp': {"ko": 'dp가 global_batch={value}를 나누지 못함', "en": 'dp does not divide global_batch={value}'},
    'plan_skip_aligned': {"ko": 'TP 그룹이나 파이프라인이 {value}개짜리 노드 경계에 걸침', "en": 'TP groups or pipelines would straddle the {value}-GPU node boundaries'},
    'plan_skip_interleaved': {"ko": 'interleaved v={value}는 pp·v개 청크에 레이어가 하나씩 있어야 하고 마이크로배치가 pp개 이상이어야 함', "en": 'interleaved v={value} needs a layer for each of the pp·v chunks and at least pp micro-batches'},
    'plan_nothing_fits': {"ko": '메모리에 맞는 배치가 없습니다: GPU를 늘리거나, micro_batch를 줄이거나, ZeRO-3 / 전체 재계산을 허용하세요.', "en": 'No layout fits: add GPUs, pin a smaller micro_batch, or allow ZeRO-3 / full recomputation.'},
    'plan_over_memory': {"ko": 'GPU당 {need:,.1f} GB 필요 > 사용 가능 {cap:,.1f} GB ({parts})', "en": 'needs {need:,.1f} GB per GPU > {cap:,.1f} GB usable ({parts})'},
    'plan_winner': {"ko": '최선: {layout} — 스텝당 {step:.3g}초, 초당 {tokens:,.0f} 토큰, MFU {mfu:.0%}, GPU당 {memory:.1f} GB. 랭크는 TP가 가장 안쪽이 되게 놓입니다: rank = (dp 좌표·pp + pp 좌표)·tp + tp 좌표 (mpkit.parallel.layout.Layout). 그래서 TP 그룹은 이웃한 GPU tp개이고, DP 그룹의 GPU는 서로 가장 멀리 떨어져 있습니다.', "en": "Best: {layout} — {step:.3g} s per step, {tokens:,.0f} tokens/s, MFU {mfu:.0%}, {memory:.1f} GB per GPU. Ranks are laid out TP innermost: rank = (dp index·pp + pp index)·tp + tp index (mpkit.parallel.layout.Layout), so a TP group is tp neighbouring GPUs and a DP group's GPUs are the farthest apart."},
    'plan_link_intra': {"ko": '한 노드 안의 링크(NVLink)', "en": 'the links inside one node (NVLink)'},
    'plan_link_inter': {"ko": '노드 사이 InfiniBand', "en": 'InfiniBand between nodes'},
    'plan_link_none': {"ko": '통신 없음', "en": 'no link'},
    'plan_tp': {"ko": '텐서 병렬 tp={tp}는 {link}로 통신합니다: 레이어와 마이크로배치마다 {mb:,.0f} MB짜리 집합 통신 {calls}번. 결과가 바로 다음 행렬곱에 필요해 계산 뒤에 숨길 수 없고, 스텝의 {share:.0%}를 차지합니다.', "en": 'Tensor parallel tp={tp} talks over {link}: {calls} collectives of {mb:,.0f} MB per layer and micro-batch, each needed by the very next matmul, so nothing hides them; they take {share:.0%} of the step.'},
    'plan_tp_wide': {"ko": '노드를 넘는 TP 중 최선(tp={tp})은 이 통신을 InfiniBand에 올려 스텝당 {step:.3g}초, {ratio:.1f}배 느립니다(TP 통신이 그 스텝의 {share:.0%}). 그래서 TP는 노드 안에 둡니다.', "en": 'The best layout with TP across nodes (tp={tp}) puts those collectives on InfiniBand: {step:.3g} s per step, {ratio:.1f}x slower (TP communication {share:.0%} of its step). That is why TP stays inside a node.'},
    'plan_tp_none': {"ko": '텐서 병렬 없음(tp=1): 각 GPU가 자기 스테이지의 레이어를 통째로 가집니다.', "en": 'No tensor parallel (tp=1): every GPU holds whole layers of its stage.'},
    'plan_pp': {"ko": '파이프라인 pp={pp}: 스테이지 경계는 {link}를 지나지만, 홉마다 마이크로배치당 활성화 하나({kb:,.0f} KB, 스텝의 {share:.0%})만 보내므로 느린 링크도 견딥니다. 대가는 버블입니다: 마이크로배치 m={m}개, GPU당 청크 v={v}개에서 공식 (p-1)/(v·m+p-1)은 {formula:.1%}, 실제 스테이지 시간으로 계산하면 스텝의 {bubble:.1%}입니다.', "en": 'Pipeline pp={pp}: stage boundaries run over {link}, but each hop carries one activation of {kb:,.0f} KB per micro-batch ({share:.0%} of the step), so PP tolerates a slow link. The price is the bubble: with m={m} micro-batches and v={v} chunks per GPU the formula (p-1)/(v·m+p-1) gives {formula:.1%}; priced with the real stage times it is {bubble:.1%} of the step.'},
    'plan_pp_flat': {"ko": '파이프라인 없이 최선은 {layout}: {step:.3g}초, 최선의 {ratio:.2f}배입니다.', "en": 'Without a pipeline the best is {layout}: {step:.3g} s, {ratio:.2f}x the winner.'},
    'plan_pp_needed': {"ko": '파이프라인 없는 배치는 메모리에 맞지 않습니다: 스테이지로 나눠야 모델이 들어갑니다.', "en": 'No layout without a pipeline fits in memory: the stages are what make the model fit.'},
    'plan_pp_none': {"ko": '파이프라인 없음(pp=1): 버블이 없습니다.', "en": 'No pipeline (pp=1): no bubble.'},
    'plan_dp': {"ko": '데이터 병렬 dp={dp}는 {link}로: GPU마다 스텝당 그래디언트 {gb:.2f} GB를 {how}. 드러난 통신은 스텝의 {share:.0%}입니다.', "en": 'Data parallel dp={dp} over {link}: {gb:.2f} GB of gradients per GPU per step, {how}; exposed: {share:.0%} of the step.'},
    'plan_dp_overlap': {"ko": '마지막 마이크로배치 뒤 한 번 리듀스하며 그 역전파와 겹칩니다(DDP 버킷처럼)', "en": 'reduced once after the last micro-batch, overlapped with its backward (as DDP buckets do)'},
    'plan_dp_exposed': {"ko": '마지막 마이크로배치 뒤 한 번 리듀스하며 겹치지 않습니다(Megatron-LM 2021처럼)', "en": 'reduced once after the last micro-batch, not overlapped (as Megatron-LM 2021 did)'},
    'plan_dp_zero': {"ko": '마이크로배치마다 리듀스-스캐터하고(ZeRO-3은 가중치 올개더 두 번 추가) 계산 뒤로 미리 보냅니다', "en": 'reduce-scattered every micro-batch (ZeRO-3 also all-gathers the weights twice), prefetched behind compute'},
    'plan_dp_none': {"ko": '데이터 병렬 없음(dp=1): 그래디언트 리듀스가 없습니다.', "en": 'No data parallel (dp=1): no gradient reduction.'},
    'plan_zero': {"ko": 'ZeRO-{zero}는 모델 상태를 데이터 병렬 그룹에 나눕니다: GPU당 {before:.1f} -> {after:.1f} GB (없으면 이 배치는 {fits}).', "en": 'ZeRO-{zero} shards model states over the data-parallel group: {before:.1f} -> {after:.1f} GB per GPU (without it this layout {fits}).'},
    'plan_fits': {"ko": '{gb:.1f} GB로 여전히 들어갑니다', "en": 'would still fit, at {gb:.1f} GB'},
    'plan_not_fit': {"ko": '{gb:.1f} GB가 필요해 들어가지 않습니다', "en": 'would need {gb:.1f} GB and not fit'},
    'plan_recompute': {"ko": '재계산({mode})은 활성화를 덜 보관합니다: GPU당 {before:.1f} -> {after:.1f} GB, 계산 {cost:+.0%} (없으면 이 배치는 {fits}).', "en": 'Recomputation ({mode}) keeps fewer activations: {before:.1f} -> {after:.1f} GB per GPU, for {cost:+.0%} compute (without it this layout {fits}).'},
    'plan_w_model': {"ko": '모델', "en": 'model'},
    'plan_w_hardware': {"ko": '하드웨어', "en": 'hardware'},
    'plan_w_gpus': {"ko": 'GPU 수', "en": 'GPUs'},
    'plan_w_global_batch': {"ko": '전역 배치', "en": 'global batch'},
    'plan_w_status': {"ko": '메모리에 맞는 배치 {fit}개, 맞지 않는 배치 {dropped}개 ({seconds:.2f}초)', "en": '{fit} layouts fit, {dropped} do not ({seconds:.2f} s)'},
    'plan_plain_fits': {"ko": 'ZeRO도 재계산도 필요 없습니다: 사용 가능한 {cap:.1f} GB 중 {gb:.1f} GB.', "en": 'Neither ZeRO nor recomputation is needed: {gb:.1f} GB of {cap:.1f} GB usable.'},

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
