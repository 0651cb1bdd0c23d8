"""Figures, Markdown and plot of ``recallspec bench serve`` from its request records.

Per (target, rate): throughput over the run's span (first request sent -> last one
ended) in output tokens/s and completed requests/s; TTFT and end-to-end latency p50 /
p99 over successful requests; ITL p50 / p99 over all their inter-token gaps pooled
(as vLLM's serving benchmark); errors counted, never averaged in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from recallspec.bench.report import peer_line
from recallspec.bench.serve_client import RequestRecord


def percentile(xs: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile with linear interpolation between order statistics
    (numpy's default); None for no values."""
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError("q must be in [0, 100]")
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stats(xs: Sequence[float]) -> dict[str, float | None]:
    return {"mean": sum(xs) / len(xs) if xs else None,
            "p50": percentile(xs, 50), "p99": percentile(xs, 99)}


def summarize(recs: Sequence[RequestRecord]) -> dict[str, Any]:
    """The figures of one target at one rate (``recs``: that run's records)."""
    ok = [r for r in recs if r.ok]
    sent = [r.sent_s for r in recs if r.sent_s is not None]
    ended = [r.end_s for r in recs if r.end_s is not None]
    span = max(ended) - min(sent) if sent and ended else 0.0
    tokens = sum(r.output_tokens for r in ok)
    return {
        "requests": len(recs), "completed": len(ok), "errors": len(recs) - len(ok),
        "error_messages": sorted({r.error for r in recs if r.error})[:5],
        "duration_s": span, "output_tokens": tokens,
        "output_tok_per_s": tokens / span if span > 0 else None,
        "req_per_s": len(ok) / span if span > 0 else None,
        "ttft_s": _stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        "itl_s": _stats([x for r in ok for x in r.itl_s]),
        "e2e_s": _stats([r.e2e_s for r in ok if r.e2e_s is not None]),
        # How late the client sent requests against the schedule (a busy client skews).
        "max_send_lag_s": max((r.sent_s - r.scheduled_s for r in recs if r.sent_s is not None),
                              default=None),
    }


def summaries(recs: Iterable[RequestRecord]) -> list[dict[str, Any]]:
    """One summary per (target, rate), in the order the records came."""
    groups: dict[tuple[str, float], list[RequestRecord]] = {}
    for r in recs:
        groups.setdefault((r.target, r.rate), []).append(r)
    return [{"target": t, "rate": rate, **summarize(g)} for (t, rate), g in groups.items()]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def _num(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else f"{x:{spec}}"


def rate_label(rate: float) -> str:
    return f"{rate:g} req/s"


def render_markdown(rep: dict[str, Any]) -> str:
    cfg, m = rep["config"], rep["machine"]
    lines = [
        "# Serving benchmark", "",
        f"Spec-Bench first turns as chat requests ({cfg['requests']} per rate, Poisson arrivals, "
        f"seed {cfg['seed']}), streamed, max_tokens {cfg['max_tokens']}, temperature 0; "
        f"model `{cfg['model'] or 'default'}`, {cfg['threads']} threads per server, context "
        f"{cfg['context']}; machine: {m.get('cpu')}, {m.get('cpus')} CPUs, "
        f"load {m.get('loadavg_1m')} at the start.", "",
        "Throughput: output tokens (and completed requests) per second from the first "
        "request sent to the last one ended. Latencies in ms: TTFT to the first token, "
        "ITL per token (a chunk of k tokens counts k gaps of 1/k its wait), e2e to the "
        "stream's end.", "",
        "| target | what |", "|---|---|",
    ]
    for name, t in rep["targets"].items():
        what = t["description"] + (f" — **skipped**: {t['skipped']}" if t.get("skipped") else "")
        lines.append(f"| {name} | {what} |")
    peers = [t["peer"] for t in rep["targets"].values() if t.get("peer")]
    if peers:
        lines += ["", *peer_line(peers[0])[:1]]
    by_rate: dict[float, list[dict[str, Any]]] = {}
    for s in rep["summaries"]:
        by_rate.setdefault(s["rate"], []).append(s)
    for rate in sorted(by_rate):
        lines += ["", f"## {rate_label(rate)}", "",
                  "| target | req/s | output tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 "
                  "| e2e p50 | e2e p99 | errors |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in by_rate[rate]:
            lines.append(
                f"| {s['target']} | {_num(s['req_per_s'])} | {_num(s['output_tok_per_s'], '.1f')} "
                f"| {_ms(s['ttft_s']['p50'])} | {_ms(s['ttft_s']['p99'])} "
                f"| {_ms(s['itl_s']['p50'])} | {_ms(s['itl_s']['p99'])} "
                f"| {_ms(s['e2e_s']['p50'])} | {_ms(s['e2e_s']['p99'])} "
                f"| {s['errors']}/{s['requests']} |")
    errs = [f"- {s['target']} at {rate_label(s['rate'])}: {msg}"
            for s in rep["summaries"] for msg in s["error_messages"]]
    if errs:
        lines += ["", "Errors (first distinct messages):", "", *errs]
    return "\n".join(lines) + "\n"


def write_plot(rep: dict[str, Any], path: Path) -> bool:
    """Output tokens/s and p50 end-to-end latency against the offered rate, a line per
    target; False without matplotlib or results."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows_all = rep["summaries"]
    if not rows_all:
        return False
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(10, 4))
    for target in dict.fromkeys(s["target"] for s in rows_all):
        rows = sorted((s for s in rows_all if s["target"] == target), key=lambda s: s["rate"])
        rates = [s["rate"] for s in rows]
        ax_t.plot(rates, [s["output_tok_per_s"] or math.nan for s in rows], marker="o",
                  label=target)
        ax_e.plot(rates, [s["e2e_s"]["p50"] or math.nan for s in rows], marker="o",
                  label=target)
    ax_t.set(xlabel="offered rate (req/s)", ylabel="output tokens/s", title="throughput")
    ax_e.set(xlabel="offered rate (req/s)", ylabel="seconds", title="p50 end-to-end latency")
    rates = sorted({s["rate"] for s in rows_all})
    for ax in (ax_t, ax_e):
        ax.set_xticks(rates)
        ax.set_ylim(bottom=0)  # absolute scale: differences read as they are
        ax.grid(alpha=0.3)
    ax_t.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
