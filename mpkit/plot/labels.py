"""Every string a plot shows, in English and Korean, in one table (so translations stay in step)."""
from __future__ import annotations

LANGS = ("en", "ko")

_TABLE = {
    # timeline
    "timeline": ("Timeline", "타임라인"),
    "step": ("step {step}", "스텝 {step}"),
    "shares": ("bubble share {bubble:.1%} · comm share {comm:.1%}", "버블 비율 {bubble:.1%} · 통신 비율 {comm:.1%}"),
    "time_ms": ("time (ms)", "시간 (ms)"),
    "rank": ("rank {rank}", "랭크 {rank}"),
    "ranks": ("rank", "랭크"),
    "idle": ("idle (bubble)", "유휴 (버블)"),
    "ideal": ("predicted", "예측"),
    "forward": ("forward", "순전파"),
    "backward": ("backward", "역전파"),
    "optimizer": ("optimizer step", "옵티마이저 스텝"),
    "compute": ("compute", "계산"),
    "send": ("send", "송신"),
    "recv": ("recv (incl. waiting)", "수신 (대기 포함)"),
    "all_reduce": ("all-reduce", "올리듀스"),
    "all_gather": ("all-gather", "올개더"),
    "reduce_scatter": ("reduce-scatter", "리듀스-스캐터"),
    "broadcast": ("broadcast", "브로드캐스트"),
    "reduce": ("reduce", "리듀스"),
    "barrier": ("barrier", "배리어"),
    "all_to_all": ("all-to-all", "올투올"),
    "rpc": ("rpc", "RPC"),
    "wait": ("wait", "대기"),
    # memory
    "memory": ("Memory per rank", "랭크별 메모리"),
    "memory_max": ("largest value of each category during the run", "실행 중 범주별 최댓값"),
    "memory_peak": ("breakdown at the peak", "최대 사용 시점의 구성"),
    "memory_final": ("at the end of the run", "실행 종료 시점"),
    "mib": ("memory (MiB)", "메모리 (MiB)"),
    "peak_total": ("peak total (number above the bar)", "최대 합계 (막대 위 숫자)"),
    "capacity": ("device capacity", "장치 용량"),
    "parameters": ("parameters", "파라미터"),
    "gradients": ("gradients", "그래디언트"),
    "activations": ("activations", "활성화"),
    "other": ("other (temporaries)", "기타 (임시 텐서)"),
    "optimizer_state": ("optimizer state", "옵티마이저 상태"),
    "memory_over_time": ("Memory over time", "시간에 따른 메모리"),
    "total": ("total", "합계"),
    # comm
    "comm": ("Bytes on the wire per rank", "랭크별 전송 바이트"),
    "whole_run": ("whole run", "전체 실행"),
    "memory_legend": ("memory", "메모리"),
    "strip_legend": ("compute (top strip)", "계산 (위쪽 띠)"),
    "bytes": ("bytes sent ({unit})", "보낸 바이트 ({unit})"),
    "comm_note": ("collectives: payload S from the event × ring formula "
                  "(all-reduce 2(N-1)/N·S, reduce-scatter / all-gather (N-1)/N·S), N = {n}\n"
                  "send / rpc: bytes measured on the event (recv counts at its sender)",
                  "집합 통신: 이벤트의 페이로드 S × 링 공식 "
                  "(올리듀스 2(N-1)/N·S, 리듀스-스캐터 / 올개더 (N-1)/N·S), N = {n}\n"
                  "송신 / RPC: 이벤트에서 측정한 바이트 (수신은 보낸 쪽에서 집계)"),
    "formula": ("hatched: ring formula", "빗금: 링 공식"),
    "measured": ("solid: measured", "단색: 측정값"),
    "ring_reference": ("ring all-reduce 2(N-1)/N·S for S = {size}", "링 올리듀스 2(N-1)/N·S, S = {size}"),
    "no_comm": ("no communication in this run", "이 실행에는 통신이 없습니다"),
    # bubble
    "bubble_title": ("Pipeline bubble vs micro-batches (p = {p}{v})", "마이크로배치 수에 따른 파이프라인 버블 (p = {p}{v})"),
    "bubble_x": ("micro-batches per step m", "스텝당 마이크로배치 수 m"),
    "bubble_y": ("bubble (idle share of the step)", "버블 (스텝 중 유휴 비율)"),
    "bubble_formula": ("formula (p-1)/(m+p-1)", "공식 (p-1)/(m+p-1)"),
    "bubble_formula_v": ("formula (p-1)/(v·m+p-1)", "공식 (p-1)/(v·m+p-1)"),
    "bubble_measured": ("measured (trace)", "측정값 (트레이스)"),
    "bubble_mp": ("m = 1: layer-wise MP, (p-1)/p", "m = 1: 레이어 단위 MP, (p-1)/p"),
    # breakdown
    "breakdown_compute": ("compute", "계산"),
    "breakdown_comm": ("communication (not hidden)", "통신 (가려지지 않은 부분)"),
    "breakdown_bubble": ("bubble (idle)", "버블 (유휴)"),
    "breakdown_title": ("Predicted step time", "예측한 스텝 시간"),
    "breakdown_xlabel": ("time per optimizer step (ms)", "옵티마이저 스텝당 시간 (ms)"),
}


def check_lang(lang) -> str:
    if lang not in LANGS:
        raise ValueError(f"lang={lang!r} is not supported; pass lang='en' or lang='ko'")
    return lang


def text(key: str, lang: str, **values) -> str:
    """The ``lang`` string for ``key``, formatted with ``values``."""
    return _TABLE[key][LANGS.index(check_lang(lang))].format(**values)


def title(key: str, run, lang: str, step=None) -> str:
    """``"Timeline — pp · step 1"``: the plot's name, the run's strategy if it has one, the step."""
    out = text(key, lang)
    strategy = getattr(run, "strategy", None)
    if strategy:
        out += f" — {strategy}"
    if step is not None:
        out += " · " + text("step", lang, step=step)
    return out
