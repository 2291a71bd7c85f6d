"""``mpkit.sim.plan``: which dp x pp x tp layout to train a large transformer with, and why.

The search in ~10 lines (``plan``, ``_candidates``, ``LayoutTable``)::

    for tp in divisors of a node's GPUs dividing the heads:     # TP inside a node unless pinned
        for cp, pp, ep, rank order:                             # dp = gpus / (tp·pp·cp), ep inside dp
            for micro_batch dividing the global batch / dp:
                for schedule, virtual, recompute, ZeRO stage:
                    e = estimate(model, hw, Setup(...), global_batch)   # analytic.py: one step, closed form
                    (rows if e.fits else dropped).append(e)
    rows.sort(key=(step time, memory))                          # fastest first
    table.explain(): why this TP, PP, DP, CP and EP; what memory it needs

Enumerates every layout of ``gpus`` GPUs (dp·pp·tp = gpus, tp dividing the attention and
key/value heads and a node's GPUs, pp at most the layers), every micro-batch size, pipeline
schedule, ZeRO stage and activation recomputation; drops what does not fit in GPU memory (with
the reason); ranks the rest by the step time ``mpkit.costmodel.analytic.estimate`` prices. Which link
a TP, PP or DP group uses comes from ``mpkit.parallel.Layout``, the same rank grid the real
3D run uses, in both rank orders where dp and pp exceed 1 (DP outermost as the run and
picotron, PP outermost as Megatron-LM); the table and the explanation say which won. The table
also states what it assumed of the training software (sequence parallelism, flash attention,
overlapped DP reduction) and shows MFU beside HFU. TP wider than a node is searched only when pinned (``tp=16``), but priced honestly
on the link between nodes: the explanation compares the winner with such a layout. Context
parallelism (``cp``, with the K/V exchange ``attention``) and expert parallelism (``ep``, for
mixture-of-experts models) are explicit options, 1 unless asked for (a size, a list of sizes or
"search"); the header states them and the explanation says what each costs.

Any knob can be pinned (``tp=8, pp=8, recompute="full"``); the others are searched. Inputs are
checked first and the search is arithmetic only (no per-rank loops), so even ``gpus=10**6``
answers in well under a second.
"""
from __future__ import annotations

import html
import itertools
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace

from mpkit.i18n import check_lang, t
from mpkit.layout import ORDERS, Layout
from mpkit.simulator import formulas
from mpkit.costmodel.analytic import CP_ATTENTION, Estimate, Setup, aligned, estimate
from mpkit.costmodel.shapes import Transformer, transformer, whole_number
from mpkit.simulator.hardware import FP8_MATMUL_SPEEDUP, STACKS, Hardware, gpu_family, with_stack
from mpkit.simulator.machines import get_hardware
from mpkit.vocabulary import CLOSED_FORM_SCHEDULES, RECOMPUTE

VIRTUAL = (2, 3, 4)  # model chunks per rank tried for the interleaved schedule
# The planner's median error against 40 published training runs it was not fitted to (benchmarks/
# published.py; BENCHMARKS.md, "Planner against published training runs"; tests/test_published_runs.py
# keeps the two equal): layouts priced closer than this to the fastest are a tie at this accuracy.
MEDIAN_ERROR = 0.054
# Each candidate is priced in ~20 us: 50,000 take about a second, so a larger search is refused at
# once (the published runs' searches hold 600-5,000; a 1e15-parameter model on 5.8 million GPUs
# held 73,000 and took 1.5 s, layers=10**6 153,000 and 2.8 s)
MAX_CANDIDATES = 50_000
_PINNABLE = ("dp", "tp", "pp", "micro_batch", "zero", "recompute", "schedule", "virtual", "order", "shard")
_COMM = ("tp", "pp", "dp", "cp", "ep")  # the exposed communication in Estimate.time


def _divisors(n: int, limit: int) -> list[int]:
    """The divisors of ``n`` up to ``limit``, in O(min(limit, sqrt n)) steps: gpus=8*10**18 or
    global_batch=10**18 answer at once (a loop to sqrt(n) took minutes)."""
    if limit <= math.isqrt(n):
        return [d for d in range(1, limit + 1) if n % d == 0]
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({d for d in small + [n // d for d in small] if d <= limit})


def _flag(name, value):
    if not isinstance(value, bool) and type(value).__name__ != "bool_":  # numpy's bool is one too
        raise ValueError(f"{name}={value!r} must be True or False")


def _choice(name, value, allowed):
    if value is not None and (isinstance(value, bool) or value not in allowed):  # zero=True is not ZeRO-1
        raise ValueError(f"{name}={value!r} is unknown; use one of {', '.join(map(repr, allowed))}")


@dataclass
class LayoutTable:
    """What ``plan`` returns: ``rows`` (layouts that fit, fastest first; ``best`` is the first),
    ``dropped`` (layouts that do not fit, each with ``over_memory()`` saying why), ``skipped``
    (reason -> count of combinations that are not layouts at all), ``pins`` (the knobs the caller
    fixed, as ``plan``'s keywords; None where searched), ``explain(lang)``."""

    model: Transformer
    hardware: Hardware
    gpus: int
    global_batch: int
    rows: list[Estimate] = field(default_factory=list)
    dropped: list[Estimate] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    lang: str = "en"
    top: int = 10
    pins: dict = field(default_factory=dict)  # plan's keywords as the caller gave them (None: searched)

    @property
    def best(self) -> Estimate | None:
        return self.rows[0] if self.rows else None

    @property
    def recommended(self) -> Estimate | None:
        """What the planner advises: the simplest layout (``simplest``) among those within its own
        median error (``MEDIAN_ERROR``) of the fastest, which the model cannot tell apart."""
        return self.simplest(MEDIAN_ERROR)

    # ---- display ------------------------------------------------------------------------------
    def _header(self, lang) -> str:
        return "\n".join([t("plan_header", lang, model=self.model.describe(), hw=self.hardware.name, gpus=self.gpus,
                             batch=self.global_batch, tokens=self.global_batch * self.model.seq_len,
                             fit=len(self.rows), dropped=len(self.dropped), seconds=self.seconds),
                           self.assumptions(lang)])

    def pinned_text(self, lang="en") -> str:
        """The knobs the caller fixed, as plan's keywords ("zero=1, tp=8"), or 'nothing'."""
        fixed = [f"{k}={v!r}" for k, v in self.pins.items() if k in _PINNABLE and v is not None]
        fixed += ["reshard_after_forward=False"] if self.pins.get("reshard_after_forward") is False else []
        fixed += ["fp8=True"] if self.pins.get("fp8") else []
        return ", ".join(fixed) or t("plan_no_pins", lang)

    def assumptions(self, lang="en") -> str:
        """What every row assumes about the training software, and what was pinned: the switches
        that decide whether a layout fits (sequence parallelism and flash attention change the
        activations several-fold) are stated, never silent."""
        word = lambda key: t("plan_on" if self.pins.get(key, True) else "plan_off", lang)  # noqa: E731
        stack = self.pins.get("stack")
        software = (t("plan_stack", lang, name=STACKS[stack].name, mfu=self.hardware.mfu, source=STACKS[stack].source)
                    if stack else t("plan_stack_none", lang, mfu=self.hardware.mfu))
        cp, ep = self.pins.get("cp", 1), self.pins.get("ep", 1)
        parallel = "" if cp == 1 and ep == 1 else t("plan_assumes_cp", lang, cp=cp, ep=ep,
                                                    kind=self.pins.get("attention", "ring"))
        return software + " " + t("plan_assumes", lang, sp=word("sequence_parallel"), flash=word("flash"),
                                  fused=word("fused"), overlap=word("overlap_dp"),
                                  pins=self.pinned_text(lang)) + parallel

    def _columns(self, lang):
        return [t("plan_col_rank", lang), "dp x pp x tp", t("plan_col_order", lang), t("plan_col_micro", lang),
                t("plan_col_schedule", lang),
                "ZeRO", t("plan_col_recompute", lang), t("plan_col_step", lang), t("plan_col_tokens", lang), "MFU",
                "HFU", t("plan_col_bubble", lang), t("plan_col_comm", lang), t("plan_col_memory", lang)]

    def _cells(self, i, e: Estimate):
        lay, s = e.setup.layout, e.setup
        sched = "-" if lay.pp == 1 else (s.schedule + (f" v={s.virtual}" if s.schedule == "interleaved" else ""))
        comm = sum(e.time.get(k, 0.0) for k in _COMM) / e.step_time
        outer = "-" if lay.dp == 1 or lay.pp == 1 else lay.dims[0]
        more = (f", cp {lay.cp}" if lay.cp > 1 else "") + (f", ep {lay.ep}" if lay.ep > 1 else "")
        return [str(i), f"{lay.dp} x {lay.pp} x {lay.tp}{more}", outer, f"{e.micro_batches} x {s.micro_batch}", sched,
                str(s.zero), s.recompute, f"{e.step_time:.3g}", f"{e.tokens_per_second:,.0f}", f"{e.mfu:.0%}",
                f"{e.hfu:.0%}",
                f"{e.bubble_share:.0%}", f"{comm:.0%}", f"{e.memory_total / 1e9:.1f}"]

    def _footer(self, lang) -> str:
        lines = []
        if self.dropped:
            tightest = min(self.dropped, key=lambda e: e.memory_total)
            closest = tightest.setup.describe(tightest.micro_batches, lang)
            lines.append(t("plan_dropped", lang, n=len(self.dropped), layout=closest, why=tightest.over_memory(lang)))
        for (key, value), n in sorted(self.skipped.items()):
            lines.append(t("plan_skipped", lang, n=n, reason=t(key, lang, value=value)))
        if not self.rows and not self.dropped:  # nothing to price: not memory, the sizes themselves
            lines.append(t("plan_no_layout", lang, gpus=self.gpus, batch=self.global_batch, layers=self.model.layers))
        elif not self.rows:
            lines.append(t("plan_nothing_fits", lang, advice=self._fit_advice(lang)))
        return "\n".join(lines)

    def _fit_advice(self, lang) -> str:
        """What could still make a layout fit: only the pins the caller set can be relaxed (what was
        searched already failed), and more GPUs or offload always remain."""
        pins = self.pins
        advice = ["plan_fit_gpus"]
        if (pins.get("micro_batch") or 1) > 1:
            advice.append("plan_fit_micro")
        if pins.get("zero") not in (None, 3):
            advice.append("plan_fit_zero3")
        if pins.get("recompute") not in (None, "full"):
            advice.append("plan_fit_full")
        searched = pins.get("zero") is None and pins.get("recompute") is None
        said = t("plan_fit_or", lang).join(t(key, lang) for key in advice)
        return said + (t("plan_fit_searched", lang) if searched else "")

    def to_text(self, lang=None, top=None) -> str:
        lang = check_lang(lang or self.lang)
        rows = [self._cells(i, e) for i, e in enumerate(self.rows[:top or self.top], 1)]
        cols = self._columns(lang)
        widths = [max(len(c), *(len(r[k]) for r in rows)) if rows else len(c) for k, c in enumerate(cols)]
        fmt = lambda cells: " | ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
        lines = [self._header(lang), fmt(cols), "-+-".join("-" * w for w in widths), *map(fmt, rows)]
        footer = self._footer(lang)
        return "\n".join(lines + ([footer] if footer else []))

    def __str__(self):
        return self.to_text()

    def _repr_html_(self):
        lang = check_lang(self.lang)
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self._columns(lang))
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in self._cells(i, e)) + "</tr>"
                       for i, e in enumerate(self.rows[:self.top], 1))
        footer = html.escape(self._footer(lang)).replace("\n", "<br>")
        return (f"<p>{html.escape(self._header(lang))}</p><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table><p>{footer}</p>")

    def __repr__(self):
        best = self.best
        what = best.setup.describe(best.micro_batches) if best else "nothing fits"
        return f"<LayoutTable {self.model.name or 'model'} on {self.gpus} x {self.hardware.name}: {what}>"

    # ---- explanation ----------------------------------------------------------------------------
    def explain(self, lang=None) -> str:
        """Why the winner wins: where TP, PP and DP run, the bubble it pays, what ZeRO and
        recomputation bought, each compared with the best layout that decides otherwise."""
        lang = check_lang(lang or self.lang)
        best = self.best
        if best is None:
            return "\n".join([self._header(lang), self._footer(lang)])
        s = best.setup
        per_node = self.hardware.devices_per_node
        out = [t("plan_winner", lang, layout=s.describe(best.micro_batches, lang), step=best.step_time,
                 tokens=best.tokens_per_second, mfu=best.mfu, hfu=best.hfu, memory=best.memory_total / 1e9,
                 order=self._explain_order(best, lang))]
        out.append(self._explain_simpler(best, lang))
        out.append(self._explain_tp(best, lang, per_node))
        out.append(self._explain_pp(best, lang))
        out.append(self._explain_dp(best, lang))
        out.append(self._explain_cp(best, lang))
        out.append(self._explain_ep(best, lang))
        out.append(self._explain_memory(best, lang))
        out.append(self._footer(lang))
        return "\n\n".join(p for p in out if p)

    def _explain_simpler(self, best, lang):
        """The recommended layout where it is not the fastest: as good within the model's error, and
        simpler (no pipeline, or no TP)."""
        simple = self.recommended
        if simple is best:
            return ""
        return t("plan_simpler", lang, layout=simple.setup.describe(simple.micro_batches, lang), step=simple.step_time,
                 ratio=simple.step_time / best.step_time - 1, error=MEDIAN_ERROR)

    def _explain_order(self, best, lang):
        """The rank order of the winner, and where the other order would put PP and DP (only where
        both dp and pp exceed 1 do the orders differ)."""
        lay = best.setup.layout
        text = t("plan_order_pp" if lay.order == "pp-dp-tp" else "plan_order_dp", lang)
        text += " " + t("plan_order_cp", lang) if lay.cp > 1 else ""
        if lay.dp == 1 or lay.pp == 1:
            return text
        other = self._best_where(lambda e: e.setup.layout.order != lay.order and e.setup.layout.dp > 1
                                 and e.setup.layout.pp > 1)
        if other is not None:
            text += " " + t("plan_order_other", lang, outer=other.setup.layout.dims[0].upper(),
                            layout=other.setup.describe(other.micro_batches, lang), step=other.step_time,
                            ratio=other.step_time / best.step_time, pp_link=self._link_text(other.links["pp"], lang),
                            dp_link=self._link_text(other.links["dp"], lang))
        return text

    def simplest(self, within: float) -> Estimate | None:
        """The layout with the fewest parallel dimensions among those priced within ``within``
        (0.05: 5 %) of the fastest: no pipeline before a pipeline, then no TP before TP, the faster
        where equally simple. A model that errs by ~``within`` cannot tell such layouts apart, and the
        simpler one is the safer bet (fewer groups, no bubble)."""
        if not self.rows:
            return None
        close = [e for e in self.rows if e.step_time <= self.rows[0].step_time * (1 + within)]
        return min(close, key=lambda e: (e.setup.layout.pp > 1, e.setup.layout.tp > 1, e.step_time))

    def _best_where(self, keep) -> Estimate | None:
        return next((e for e in self.rows if keep(e)), None)

    def _link_text(self, where, lang):
        """Names the link a group uses by the kind the hardware states: inside a node its collective
        link's (NVLink, PCIe), between nodes its inter-node link's (InfiniBand); no brand where the
        hardware does not say."""
        if where == "intra":
            where = {"nvlink": "intra", "pcie": "intra_pcie"}.get(self.hardware.collective.kind, "intra_other")
        elif where == "inter":
            inter = self.hardware.inter_node  # None: the groups that span nodes are priced on the in-node link
            where = "inter" if inter is not None and inter.kind == "infiniband" else "inter_other"
        return t("plan_link_" + where, lang)

    def across_nodes(self) -> Estimate | None:
        """The best layout whose TP groups span two or more nodes, at the narrowest such tp that
        the pins leave room for and where a layout fits in memory, under every pin of this table
        but tp (dp, pp, micro_batch, schedule, virtual, zero, recompute and the software): only
        where TP runs differs. None where the pins leave no such layout or none of them fits."""
        per_node = self.hardware.devices_per_node
        pins = {k: v for k, v in self.pins.items() if k != "tp"}
        dp, pp = pins["dp"], pins["pp"]

        def room(tp):  # dp and pp as pinned (or some pp <= layers where only dp is)
            if self.gpus % tp or self.model.heads % tp or self.model.kv % tp:
                return False
            rest = self.gpus // tp
            if dp is not None:
                return rest % dp == 0 and (rest // dp == pp if pp is not None else rest // dp <= self.model.layers)
            return pp is None or rest % pp == 0

        # tp divides the heads, so at most heads wide (gpus=8*10**18 must not loop to gpus)
        for wide in (tp for tp in range(2 * per_node, min(self.gpus, self.model.heads) + 1, per_node) if room(tp)):
            best = plan(self.model, self.hardware, self.gpus, self.global_batch, tp=wide, **pins).best
            if best is not None:
                return best
        return None

    def _explain_tp(self, best, lang, per_node):
        lay = best.setup.layout
        share = best.time["tp"] / best.step_time
        if lay.tp == 1:
            text = t("plan_tp_none", lang)
        else:
            kind = t("plan_tp_kind_sp" if best.setup.sequence_parallel else "plan_tp_kind_ar", lang)
            text = t("plan_tp", lang, tp=lay.tp, link=self._link_text(best.links["tp"], lang), share=share,
                     calls=4 + (2 if best.setup.recompute == "full" else 0), mb=best.comm_bytes["tp"] / 1e6, kind=kind)
        wide = self.across_nodes() if lay.tp <= per_node else None
        if wide is not None:
            key = "plan_tp_wide" if wide.step_time >= best.step_time else "plan_tp_wide_faster"
            text += " " + t(key, lang, tp=wide.setup.layout.tp, step=wide.step_time, link=self._link_text("inter", lang),
                            ratio=wide.step_time / best.step_time, share=wide.time["tp"] / wide.step_time)
        return text

    def _explain_pp(self, best, lang):
        lay, s = best.setup.layout, best.setup
        if lay.pp == 1:
            text = t("plan_pp_none", lang)
        else:
            v = s.virtual if s.schedule == "interleaved" else 1
            formula = formulas.bubble_fraction(lay.pp, best.micro_batches, v, "interleaved" if v > 1 else "1f1b",
                                               relative_to="step")
            text = t("plan_pp", lang, pp=lay.pp, link=self._link_text(best.links["pp"], lang),
                     kb=best.comm_bytes["pp"] / 1e3, full=best.comm_bytes["pp"] * lay.tp / 1e3, m=best.micro_batches,
                     v=v, formula=formula,
                     bubble=best.bubble_share, share=best.time["pp"] / best.step_time)
        flat = self._best_where(lambda e: e.setup.layout.pp == 1)
        if flat is not None and lay.pp > 1:
            text += " " + t("plan_pp_flat", lang, layout=flat.setup.describe(flat.micro_batches, lang),
                            step=flat.step_time, ratio=flat.step_time / best.step_time)
        elif flat is None and lay.pp > 1:
            free = self.pins.get("zero") is None and self.pins.get("tp") is None and self.pins.get("dp") is None
            text += " " + (t("plan_pp_needed_free", lang) if free else
                           t("plan_pp_needed", lang, pins=self.pinned_text(lang)))
        return text

    def _explain_dp(self, best, lang):
        lay, s = best.setup.layout, best.setup
        if lay.dp == 1:
            return t("plan_dp_none", lang)
        link, gb = self._link_text(best.links["dp"], lang), best.comm_bytes["dp"] / 1e9
        share = best.time["dp"] / best.step_time
        if s.zero >= 2:  # one gradient's reduce-scatter per micro-batch, m of them per step
            return t("plan_dp_zero", lang, dp=lay.dp, link=link, gb=gb, m=best.micro_batches, share=share)
        how = t("plan_dp_overlap" if s.overlap_dp else "plan_dp_exposed", lang)
        return t("plan_dp", lang, dp=lay.dp, link=link, gb=gb, how=how, share=share)

    def _explain_cp(self, best, lang):
        """Context parallelism, where it was asked for or the model's sequences are split."""
        lay = best.setup.layout
        if lay.cp == 1 and self.pins.get("cp", 1) == 1:
            return ""
        if lay.cp == 1:
            return t("plan_cp_none", lang)
        text = t("plan_cp", lang, cp=lay.cp, link=self._link_text(best.links["cp"], lang), s=self.model.seq_len,
                 local=self.model.seq_len // lay.cp, kind=best.setup.attention, kb=best.comm_bytes["cp"] / 1e3,
                 share=best.time["cp"] / best.step_time)
        flat = self._best_where(lambda e: e.setup.layout.cp == 1)
        if flat is not None:
            return text + " " + t("plan_cp_flat", lang, layout=flat.setup.describe(flat.micro_batches, lang),
                                  step=flat.step_time, ratio=flat.step_time / best.step_time)
        tried = self.pins.get("cp") in ("search",) or (isinstance(self.pins.get("cp"), (list, tuple))
                                                          and 1 in self.pins["cp"])
        return text + (" " + t("plan_cp_needed", lang) if tried else "")

    def _explain_ep(self, best, lang):
        """Expert parallelism, for a mixture-of-experts model."""
        lay, experts = best.setup.layout, self.model.experts
        if experts == 1:
            return ""
        if lay.ep == 1:
            return t("plan_ep_none", lang, experts=experts)
        return t("plan_ep", lang, ep=lay.ep, link=self._link_text(best.links["ep"], lang), experts=experts,
                 per=experts / lay.ep, mb=best.comm_bytes["ep"] / 1e6, share=best.time["ep"] / best.step_time)

    def _explain_memory(self, best, lang):
        s = best.setup
        parts = []
        if s.zero > 0:
            plain = estimate(self.model, self.hardware, replace(s, zero=0), self.global_batch)
            states = lambda e: e.memory["parameters"] + e.memory["gradients"] + e.memory["optimizer"]  # noqa: E731
            parts.append(t("plan_zero", lang, zero=s.zero, what=t(f"plan_zero_what_{s.zero}", lang),
                           before=states(plain) / 1e9, after=states(best) / 1e9,
                           fits=t("plan_fits" if plain.fits else "plan_not_fit", lang, gb=plain.memory_total / 1e9)))
        if s.recompute != "none":
            plain = estimate(self.model, self.hardware, replace(s, recompute="none"), self.global_batch)
            parts.append(t("plan_recompute", lang, mode=s.recompute, before=plain.memory["activations"] / 1e9,
                           after=best.memory["activations"] / 1e9,
                           cost=best.time["compute"] / plain.time["compute"] - 1,
                           fits=t("plan_fits" if plain.fits else "plan_not_fit", lang, gb=plain.memory_total / 1e9)))
        if not parts:
            parts.append(t("plan_plain_fits", lang, gb=best.memory_total / 1e9, cap=best.capacity / 1e9))
        return " ".join(parts)


def _sizes(name, value, limit) -> list[int]:
    """The sizes a cp or ep option asks for: a whole number, a list of them, or "search" (every
    divisor of ``limit``: the GPUs for cp, what divides both the GPUs and the experts for ep)."""
    if isinstance(value, str):
        if value != "search":
            raise ValueError(f"{name}={value!r} is unknown; use a whole number, a list of them or 'search'")
        return _divisors(limit, limit)
    values = list(value) if isinstance(value, (list, tuple, range)) else [value]
    if not values:
        raise ValueError(f"{name}={value!r} is empty; give at least one size (1: none)")
    for v in values:
        whole_number(name, v)
    return sorted({int(v) for v in values})


def _check_cp_ep(model, gpus, cps, eps, attention):
    _choice("attention", attention, CP_ATTENTION)
    if not any(gpus % cp == 0 for cp in cps):
        raise ValueError(f"cp={cps} divides no part of gpus={gpus}; choose cp dividing the GPUs")
    if len(cps) == 1 and cps[0] > 1 and model.seq_len % _cp_chunks(cps[0], attention):
        parts = "cp" if attention == "ulysses" else "2·cp (the load-balanced causal split)"
        raise ValueError(f"seq_len={model.seq_len} is not divisible by {parts} = "
                         f"{_cp_chunks(cps[0], attention)}; choose cp so that it is")
    if max(eps) > 1 and model.experts == 1:
        raise ValueError(f"ep={max(eps)} splits experts, but {model.name or 'the model'} is dense (experts=1); give "
                         f"the model experts=N, top_k=K or leave ep=1")
    if len(eps) == 1 and model.experts % eps[0]:
        raise ValueError(f"ep={eps[0]} does not divide experts={model.experts}: each rank holds an equal share of "
                         f"the experts; choose ep dividing the experts")


def _check(model, hw, gpus, global_batch, pinned, max_micro_batch, software, top):
    whole_number("global_batch", global_batch)
    whole_number("max_micro_batch", max_micro_batch)
    whole_number("top", top)
    for name, value in software.items():
        _flag(name, value)
    hw.check_world(gpus, name="gpus")
    per_node = hw.devices_per_node
    if gpus > per_node and gpus % per_node:
        raise ValueError(f"gpus={gpus} is not a multiple of the {per_node} GPUs per node of {hw.name!r}; use whole "
                         f"nodes ({per_node}, {2 * per_node}, {3 * per_node}, ...)")
    for name in ("dp", "tp", "pp", "micro_batch", "virtual", "shard"):
        if pinned[name] is not None:
            whole_number(name, pinned[name])
    _choice("zero", pinned["zero"], formulas.ZERO_STAGES)
    _choice("recompute", pinned["recompute"], RECOMPUTE)
    _choice("schedule", pinned["schedule"], CLOSED_FORM_SCHEDULES)
    _choice("order", pinned["order"], tuple(ORDERS))
    dims = {d: pinned[d] for d in ("dp", "tp", "pp") if pinned[d] is not None}
    cp = pinned["cps"][0] if len(pinned["cps"]) == 1 else 1
    if cp > 1:
        dims["cp"] = cp
    if gpus % math.prod(dims.values()):
        given = ", ".join(f"{d}={v}" for d, v in dims.items())
        raise ValueError(f"dp*tp*pp{'*cp' if cp > 1 else ''} must equal gpus={gpus}; the pinned sizes ({given}) do "
                         f"not divide it")
    if len(dims) - (cp > 1) == 3 and math.prod(dims.values()) != gpus:
        raise ValueError(f"dp*tp*pp{'*cp' if cp > 1 else ''} = {math.prod(dims.values())} but gpus={gpus}; choose "
                         f"sizes whose product is gpus")
    if pinned["tp"] is not None and (model.heads % pinned["tp"] or model.kv % pinned["tp"]):
        raise ValueError(f"tp={pinned['tp']} does not divide heads={model.heads} (key/value heads {model.kv}); "
                         f"tensor parallel splits whole heads")
    if pinned["pp"] is not None and pinned["pp"] > model.layers:
        raise ValueError(f"pp={pinned['pp']} is more than the {model.layers} layers; each stage needs a layer")
    if pinned["dp"] is not None and global_batch % pinned["dp"]:
        raise ValueError(f"global_batch={global_batch} is not divisible by dp={pinned['dp']}: every data-parallel "
                         f"replica takes an equal share; choose global_batch as a multiple of dp")
    if pinned["micro_batch"] is not None and pinned["dp"] is not None:
        share = global_batch // pinned["dp"]
        if share % pinned["micro_batch"]:
            raise ValueError(f"micro_batch={pinned['micro_batch']} does not divide the {share} sequences per replica "
                             f"(global_batch={global_batch} / dp={pinned['dp']})")
    if pinned["shard"] is not None and pinned["zero"] == 0:
        raise ValueError(f"shard={pinned['shard']} shards ZeRO's states over groups of the DP dimension: pin zero=1, "
                         f"2 or 3 (or leave zero to the search)")
    if pinned["shard"] is not None and pinned["dp"] is not None and pinned["dp"] % pinned["shard"]:
        raise ValueError(f"shard={pinned['shard']} does not divide dp={pinned['dp']}: HSDP splits the DP group into "
                         f"equal shard groups")
    if pinned["virtual"] is not None and pinned["schedule"] not in (None, "interleaved"):
        raise ValueError(f"virtual={pinned['virtual']} model chunks only apply to schedule='interleaved'")


def plan(model, hardware="8xH100-nvlink", gpus=None, global_batch=None, *, dp=None, tp=None, pp=None,
         micro_batch=None, zero=None, recompute=None, schedule=None, virtual=None, order=None, sequence_parallel=True,
         flash=True, overlap_dp=True, stack=None, shard=None, reshard_after_forward=True, fp8=False, cp=1, ep=1,
         attention="ring", fused=True, max_micro_batch=16, lang="en", top=10) -> LayoutTable:
    """The layouts of ``gpus`` GPUs of ``hardware`` that train ``model`` with ``global_batch``
    sequences per step, fastest first, with the ones that do not fit and why.

    ``model``: a preset ("gpt3-175b", "llama3-405b", ...), a size (175e9, "7B": GPT-3 shape),
    a dict of ``mpkit.sim.Transformer`` fields or a Transformer. ``hardware``: a preset
    ("8xH100-nvlink"; multi-node "4x8xH100-ib", "Nx8xA100-ib") or a Hardware; ``gpus`` defaults
    to all of it. Pin any of dp, tp, pp, micro_batch, zero (0-3), recompute ("none",
    "selective", "full", or "op": torchtitan's op-level checkpointing, searched only when
    pinned), schedule ("1f1b", "interleaved", "gpipe"), virtual (chunks per rank),
    shard (hybrid sharding, HSDP: the ZeRO stage within groups of ``shard`` neighbouring DP ranks,
    replicas across them; priced only when pinned), reshard_after_forward (ZeRO-3: False keeps the
    gathered weights from forward to backward, as FSDP2's option), fp8 (the blocks' matmuls in FP8,
    H100 presets), order (the rank order, outermost first: "dp-pp-tp" as picotron and mpkit's 3d run, or
    "pp-dp-tp" as Megatron-LM; both are searched where dp and pp exceed 1);
    the rest is searched (tp only within a node's GPUs unless pinned). ``sequence_parallel``,
    ``flash`` (fused causal attention), ``fused`` (each norm and activation one kernel, as
    Megatron's kernels or torch.compile give; False: a Llama block run eagerly, one kernel per
    PyTorch op, as torchtitan without compile) and ``overlap_dp`` (gradient reduction hidden behind
    backward) describe the training software; ``stack`` ("megatron", "deepspeed", "torchtitan",
    "llm-foundry", "llama3", "generic"; ``mpkit.simulator.hardware.STACKS``) prices matmuls at the rate
    that software's published runs imply on this GPU (None: the hardware preset's fitted rate). ``cp``: context
    parallel ranks per sequence (1: none; a size, a list of sizes or "search": the divisors of the
    GPUs), sitting just outside TP in either rank order; ``attention``: how they exchange keys and
    values ("ring", "all-gather" as Llama 3, "ulysses"); ``ep``: expert parallel ranks, carved out
    of DP as in Megatron-Core (a size, a list or "search"; mixture-of-experts models only).
    The table's header states every one of these."""
    start = time.perf_counter()
    model = transformer(model)
    hw = get_hardware(hardware)
    if stack is not None:
        hw = with_stack(hw, stack)
    check_lang(lang)
    if gpus is None:
        if hw.nodes is None:
            raise ValueError(f"gpus is required for hardware={hw.name!r} (any number of nodes): pass gpus=N")
        gpus = hw.nodes * hw.devices_per_node
    if global_batch is None:
        raise ValueError("global_batch is required: the sequences per optimizer step (GPT-3 used 1536)")
    pinned = dict(dp=dp, tp=tp, pp=pp, micro_batch=micro_batch, zero=zero, recompute=recompute,
                  schedule=schedule, virtual=virtual, order=order, shard=shard)
    software = dict(sequence_parallel=sequence_parallel, flash=flash, overlap_dp=overlap_dp,
                    reshard_after_forward=reshard_after_forward, fp8=fp8, fused=fused)
    whole_number("gpus", gpus)
    cps, eps = _sizes("cp", cp, int(gpus)), _sizes("ep", ep, math.gcd(int(gpus), model.experts))
    _check_cp_ep(model, gpus, cps, eps, attention)
    _check(model, hw, gpus, global_batch, dict(pinned, cps=cps), max_micro_batch, software, top)
    if software["fp8"] and gpu_family(hw) not in FP8_MATMUL_SPEEDUP:
        raise ValueError(f"fp8=True needs FP8 tensor cores with a measured speed-up ({', '.join(FP8_MATMUL_SPEEDUP)} "
                         f"presets); hardware={hw.name!r} has none: use fp8=False")
    # numpy's integers (a sweep over np.arange) as Python's: plain arithmetic from here on
    gpus, global_batch, max_micro_batch, top = int(gpus), int(global_batch), int(max_micro_batch), int(top)
    pinned = {k: v if v is None or isinstance(v, str) else int(v) for k, v in pinned.items()}
    software = {k: bool(v) for k, v in software.items()}
    table = LayoutTable(model, hw, gpus, global_batch, lang=lang, top=top,
                        pins=dict(pinned, **software, stack=stack, max_micro_batch=max_micro_batch, cp=cp, ep=ep,
                                  attention=attention))
    per_node = hw.devices_per_node
    pinned.update(cps=cps, eps=eps)
    software["attention"] = attention
    for setup in list(_candidates(model, gpus, global_batch, pinned, max_micro_batch, software, table.skipped,
                                  per_node)):
        e = estimate(model, hw, setup, global_batch)
        (table.rows if e.fits else table.dropped).append(e)
    table.rows.sort(key=lambda e: (e.step_time, e.memory_total))
    table.seconds = time.perf_counter() - start
    return table


def _candidates(model: Transformer, gpus, global_batch, pinned, max_micro_batch, software, skipped, per_node):
    """Every Setup the search prices; combinations that are no layout go to ``skipped``.
    Selective recomputation is left out under flash attention (it never stores the scores that
    selective recomputation would drop: the same layout twice), and "op" (torchtitan's op-level
    checkpointing) is priced only when pinned."""
    modes = [pinned["recompute"]] if pinned["recompute"] else [
        r for r in RECOMPUTE if r != "op" and not (software["flash"] and r == "selective")]
    tps = [pinned["tp"]] if pinned["tp"] else [d for d in _divisors(per_node, per_node) if gpus % d == 0
                                               and model.heads % d == 0 and model.kv % d == 0]
    count = 0
    for tp, cp in itertools.product(tps, pinned["cps"]):
        if gpus % (tp * cp):
            continue
        if cp > 1 and not _cp_splits(model, tp, cp, software["attention"]):
            skipped["plan_skip_cp", cp] += 1
            continue
        pps = [pinned["pp"]] if pinned["pp"] else _divisors(gpus // (tp * cp), model.layers)
        for pp, ep in itertools.product(pps, pinned["eps"]):
            if gpus % (tp * pp * cp):
                continue
            dp = gpus // (tp * pp * cp)
            if pinned["dp"] and dp != pinned["dp"]:
                continue
            if dp % ep or model.experts % ep:
                skipped["plan_skip_ep", ep] += 1
                continue
            if global_batch % dp:
                skipped["plan_skip_dp", global_batch] += 1
                continue
            shard = pinned["shard"] or 0
            if dp % (shard or 1):
                skipped["plan_skip_shard", shard] += 1
                continue
            orders = [pinned["order"]] if pinned["order"] else (
                list(ORDERS) if dp > 1 and pp > 1 else ["dp-pp-tp"])  # one dimension of 1: the same grid
            layouts = [Layout(dp, pp, tp, order, cp, ep) for order in orders]
            straddle = [lay for lay in layouts if not aligned(lay, per_node)]
            if straddle:
                skipped["plan_skip_aligned", per_node] += len(straddle)
                layouts = [lay for lay in layouts if lay not in straddle]
                if not layouts:
                    continue
            per_replica = global_batch // dp
            zeros = [pinned["zero"]] if pinned["zero"] is not None else (
                (range(1 if shard else 0, 4)) if dp * cp > 1 else (0,))
            micro = [pinned["micro_batch"]] if pinned["micro_batch"] else _divisors(per_replica, max_micro_batch)
            for b in micro:
                if per_replica % b:
                    continue
                m = per_replica // b
                for sched, v in _schedules(model, pp, m, pinned, skipped):
                    for rec, z, lay in itertools.product(modes, zeros, layouts):
                        count += 1
                        if count > MAX_CANDIDATES:
                            raise ValueError(f"more than {MAX_CANDIDATES:,} layouts to price for gpus={gpus}; "
                                             f"pin some of dp, tp, pp or micro_batch")
                        yield Setup(lay, b, z, rec, sched, v, **software, shard=shard)


def _cp_splits(model, tp, cp, attention) -> bool:
    """Whether cp ranks can share each sequence: 2·cp equal chunks for the load-balanced causal
    split (ring, all-gather), or cp equal parts and whole heads of a TP slice (Ulysses)."""
    whole_heads = attention != "ulysses" or ((model.heads // tp) % cp == 0 and (model.kv // tp) % cp == 0)
    return model.seq_len % _cp_chunks(cp, attention) == 0 and whole_heads


def _cp_chunks(cp, attention) -> int:
    """The parts each sequence is cut into: cp for Ulysses, 2·cp for the load-balanced causal split."""
    return cp if attention == "ulysses" else 2 * cp


def _schedules(model, pp, m, pinned, skipped):
    if pp == 1:
        yield "1f1b", 1
        return
    wanted = pinned["schedule"]
    if wanted in (None, "1f1b"):
        yield "1f1b", 1
    if wanted == "gpipe":
        yield "gpipe", 1
    if wanted in (None, "interleaved"):
        for v in ([pinned["virtual"]] if pinned["virtual"] else VIRTUAL):
            if pp * v > model.layers or m < pp:
                if wanted == "interleaved":
                    skipped["plan_skip_interleaved", v] += 1
                continue
            yield "interleaved", v


__all__ = ["plan", "LayoutTable"]
