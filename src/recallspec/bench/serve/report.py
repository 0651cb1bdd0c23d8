"""Figures, Markdown and plot of ``recallspec bench serve`` from its request records.

Per (target, rate): throughput over the run's span (first request sent -> last one
ended) in output tokens/s and completed requests/s; TTFT and end-to-end latency p50 /
p99 over successful requests; TTFT again over the turns >= 2 of their sessions (turn
index >= 1: the requests whose prompt starts with an earlier request's, what a prefix
cache serves) with the share of their prompt tokens the server reported cached; ITL
p50 / p99 over all inter-token gaps pooled (as vLLM's serving benchmark); per request,
its output tokens over its end-to-end latency (``request_tok_per_s``); errors
counted, never averaged in. ``prefix_rows`` sets each of our targets beside its
``-nocache`` twin and llama-server.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from recallspec.bench.common.report import num, peer_line, pyplot
from recallspec.bench.serve.client import RequestRecord
from recallspec.bench.serve.config import NOCACHE, OURS_TARGETS
from recallspec.markdown import table_lines


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


def _cached_share(recs: Sequence[RequestRecord]) -> float | None:
    """Cached / prompt tokens summed over the requests whose server reported both."""
    both = [r for r in recs if r.cached_tokens is not None and r.prompt_tokens]
    total = sum(r.prompt_tokens or 0 for r in both)
    return sum(r.cached_tokens or 0 for r in both) / total if total else None


def summarize(recs: Sequence[RequestRecord]) -> dict[str, Any]:
    """The figures of one target at one rate (``recs``: that run's records)."""
    ok = [r for r in recs if r.ok]
    later = [r for r in ok if r.turn >= 1]
    sent = [r.sent_s for r in recs if r.sent_s is not None]
    ended = [r.end_s for r in recs if r.end_s is not None]
    span = max(ended) - min(sent) if sent and ended else 0.0
    tokens = sum(r.output_tokens for r in ok)
    return {
        "sessions": len({r.index for r in recs}),
        "requests": len(recs), "completed": len(ok), "errors": len(recs) - len(ok),
        "later_turns": len([r for r in recs if r.turn >= 1]),
        "error_messages": sorted({r.error for r in recs if r.error})[:5],
        "duration_s": span, "output_tokens": tokens,
        "output_tok_per_s": tokens / span if span > 0 else None,
        "req_per_s": len(ok) / span if span > 0 else None,
        "ttft_s": _stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        "ttft_later_s": _stats([r.ttft_s for r in later if r.ttft_s is not None]),
        "cached_share": _cached_share(ok), "cached_share_later": _cached_share(later),
        # Against the context every server got: the longest prompt it reported.
        "max_prompt_tokens": max((r.prompt_tokens for r in ok if r.prompt_tokens), default=None),
        "itl_s": _stats([x for r in ok for x in r.itl_s]),
        "e2e_s": _stats([r.e2e_s for r in ok if r.e2e_s is not None]),
        # Per request: its output tokens over its end-to-end latency (what one client sees).
        "request_tok_per_s": _stats([r.output_tokens / r.e2e_s for r in ok
                                     if r.e2e_s and r.output_tokens]),
        # How late the client sent requests against the schedule (a busy client skews).
        "max_send_lag_s": max((r.sent_s - r.scheduled_s for r in recs if r.sent_s is not None),
                              default=None),
        **_agent_figures(recs),
    }


def _agent_figures(recs: Sequence[RequestRecord]) -> dict[str, Any]:
    """Agent workloads' answers (the share judged valid: schema-valid JSON, BFCL's AST or
    multi-turn check; a failed request counts as invalid) and, where the server reports
    its speculation, tokens per step and the forced tokens' share of the accepted."""
    scored = [r for r in recs if r.valid is not None or (not r.ok and r.workload in
              ("extract", "bfcl"))]
    sessions = {r.session for r in recs}
    if recs and recs[0].workload == "bfcl_multiturn":  # one verdict per session
        valid_n = sum(bool(r.valid) for r in recs)
        valid = valid_n / len(sessions) if sessions else None
    else:
        valid = sum(bool(r.valid) for r in scored) / len(scored) if scored else None
    specs = [r.speculative_decoding for r in recs if r.ok and r.speculative_decoding]
    steps = sum(int(sp.get("num_steps", 0)) for sp in specs)
    accepted = sum(int(sp.get("num_accepted_tokens", 0)) for sp in specs)
    forced = sum(int(sp.get("num_forced_tokens", 0)) for sp in specs)
    committed = sum(r.output_tokens for r in recs if r.ok and r.speculative_decoding)
    return {"valid_share": valid,
            "tokens_per_step": committed / steps if steps else None,
            "forced_share": forced / accepted if accepted else None}


def summaries(recs: Iterable[RequestRecord]) -> list[dict[str, Any]]:
    """One summary per (workload, target, rate), in the order the records came."""
    groups: dict[tuple[str, str, float], list[RequestRecord]] = {}
    for r in recs:
        groups.setdefault((r.workload, r.target, r.rate), []).append(r)
    return [{"workload": w, "target": t, "rate": rate, **summarize(g)}
            for (w, t, rate), g in groups.items()]


def prefix_rows(sums: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (workload, rate) and each of our targets run with or without its prefix
    cache: TTFT p50 over turns >= 2 with the cache (``on``), without (``off``) and of
    every llama.cpp target (``llamacpp``: name -> p50); None where not measured."""
    p50 = {(s["workload"], s["rate"], s["target"]): s["ttft_later_s"]["p50"] for s in sums}
    rows = []
    for w, rate in dict.fromkeys((s["workload"], s["rate"]) for s in sums):
        peers = {t: v for (w2, r2, t), v in p50.items()
                 if (w2, r2) == (w, rate) and t.startswith("llamacpp")}
        for base in OURS_TARGETS:
            on, off = p50.get((w, rate, base)), p50.get((w, rate, base + NOCACHE))
            if (w, rate, base) in p50 or (w, rate, base + NOCACHE) in p50:
                rows.append({"workload": w, "rate": rate, "target": base, "on": on,
                             "off": off, "llamacpp": peers})
    return rows


def _ms(x: float | None) -> str:
    return num(None if x is None else x * 1000, ".0f")


def rate_label(rate: float, workload: str = "spec_bench") -> str:
    """Spec-Bench's sessions are single requests: its rate reads as requests/s."""
    return f"{rate:g} {'req' if workload == 'spec_bench' else 'sessions'}/s"


def _ratio(a: float | None, b: float | None) -> str:
    return num(None if a is None or not b else a / b, ".2f", "x")


def _pct(x: float | None) -> str:
    return num(None if x is None else 100 * x, ".0f", "%")


def render_markdown(rep: dict[str, Any]) -> str:
    cfg, m, wl = rep["config"], rep["machine"], rep["workload"]
    workload = wl["name"]
    later = any(s["later_turns"] for s in rep["summaries"])
    load = (f"{cfg['requests']} requests per rate at Poisson arrivals (seed {cfg['seed']})"
            if cfg["sessions"] == cfg["requests"] else
            f"{cfg['sessions']} sessions ({cfg['requests']} requests) per rate, starting at "
            f"Poisson arrivals (seed {cfg['seed']}), each sending its next request when the "
            "previous answer has ended")
    lines = [
        "# Serving benchmark", "",
        f"Workload `{workload}`: {wl['description']}; {load}; "
        f"streamed, max_tokens {cfg['max_tokens']}, temperature 0; model "
        f"`{cfg['model'] or 'default'}`, {cfg['threads']} threads per server, context "
        f"{cfg['context']} per sequence; machine: {m.get('cpu')}, {m.get('cpus')} CPUs, "
        f"load {m.get('loadavg_1m')} at the start.", "",
        "Throughput: output tokens (and completed requests) per second from the first "
        "request sent to the last one ended. Latencies in ms: TTFT to the first token, "
        "ITL per token (a chunk of k tokens counts k gaps of 1/k its wait), e2e to the "
        "stream's end."
        + (" TTFT 2+: over the turns >= 2 of the sessions; cached: the share of those "
           "turns' prompt tokens the server reported as cached "
           "(`usage.prompt_tokens_details.cached_tokens`)." if later else ""), "",
    ]
    if wl.get("history"):
        lines += ["Every target's transcript carries its own earlier answers (as a chat "
                  "client sends them), so after the first turn the targets' prompts differ "
                  "where their answers do.", ""]
    lines += table_lines(["target", "what"], [
        [name, t["description"] + (f" — **skipped**: {t['skipped']}" if t.get("skipped") else "")]
        for name, t in rep["targets"].items()])
    peers = [t["peer"] for t in rep["targets"].values() if t.get("peer")]
    if peers:
        lines += ["", *peer_line(peers[0])[:1]]
    by_rate: dict[float, list[dict[str, Any]]] = {}
    for s in rep["summaries"]:
        by_rate.setdefault(s["rate"], []).append(s)
    agent = any(s.get("valid_share") is not None for s in rep["summaries"])
    header = ["target", "req/s", "output tok/s", "TTFT p50", "TTFT p99",
              *(["TTFT 2+ p50", "TTFT 2+ p99", "cached 2+"] if later else []),
              "ITL p50", "ITL p99", "e2e p50", "e2e p99", "errors",
              *(["request tok/s p50", "valid", "tokens / step", "forced share"]
                if agent else [])]
    for rate in sorted(by_rate):
        rows = []
        for s in by_rate[rate]:
            extra = ([_ms(s["ttft_later_s"]["p50"]), _ms(s["ttft_later_s"]["p99"]),
                      _pct(s["cached_share_later"])] if later else [])
            rows.append([
                s["target"], num(s["req_per_s"]), num(s["output_tok_per_s"], ".1f"),
                _ms(s["ttft_s"]["p50"]), _ms(s["ttft_s"]["p99"]), *extra,
                _ms(s["itl_s"]["p50"]), _ms(s["itl_s"]["p99"]), _ms(s["e2e_s"]["p50"]),
                _ms(s["e2e_s"]["p99"]), f"{s['errors']}/{s['requests']}",
                *([num(s["request_tok_per_s"]["p50"], ".1f"), _pct(s.get("valid_share")),
                   num(s.get("tokens_per_step"), ".2f"), _pct(s.get("forced_share"))]
                  if agent else [])])
        lines += ["", f"## {rate_label(rate, workload)}", "",
                  *table_lines(header, rows, "-" + "r" * (len(header) - 1))]
    if later:
        lines += _prefix_section(rep["summaries"], workload)
    errs = [f"- {s['target']} at {rate_label(s['rate'], workload)}: {msg}"
            for s in rep["summaries"] for msg in s["error_messages"]]
    if errs:
        lines += ["", "Errors (first distinct messages):", "", *errs]
    return "\n".join(lines) + "\n"


def _prefix_section(sums: Sequence[dict[str, Any]], workload: str) -> list[str]:
    """TTFT p50 over turns >= 2: each of our targets with vs without its prefix cache,
    and vs llama-server (its own prompt cache on)."""
    rows = prefix_rows(sums)
    if not rows:
        return []
    peers = list(dict.fromkeys(t for r in rows for t in r["llamacpp"]))
    header = ["rate", "ours", "cache on", "cache off", "on / off",
              *(c for p in peers for c in (p, f"on / {p}"))]
    cells = [[rate_label(r["rate"], workload), r["target"], _ms(r["on"]), _ms(r["off"]),
              _ratio(r["on"], r["off"]),
              *(c for p in peers
                for c in (_ms(r["llamacpp"].get(p)), _ratio(r["on"], r["llamacpp"].get(p))))]
             for r in rows]
    return ["", f"## Prefix cache: TTFT p50 over turns >= 2, `{workload}` (ms)", "",
            *table_lines(header, cells, "--" + "r" * (len(header) - 2))]


def write_plot(rep: dict[str, Any], path: Path) -> bool:
    """Output tokens/s, p50 end-to-end latency and (for sessions of several turns) p50
    TTFT over turns >= 2 against the offered rate, a line per target; False without
    matplotlib or results."""
    plt = pyplot()
    if plt is None:
        return False
    rows_all = rep["summaries"]
    if not rows_all:
        return False
    panels = [("output_tok_per_s", None, "output tokens/s", "throughput"),
              ("e2e_s", "p50", "seconds", "p50 end-to-end latency")]
    if any(s["later_turns"] for s in rows_all):
        panels.append(("ttft_later_s", "p50", "seconds", "p50 TTFT, turns >= 2"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    unit = rate_label(1, rep["workload"]["name"]).split(" ", 1)[1]
    for target in dict.fromkeys(s["target"] for s in rows_all):
        rows = sorted((s for s in rows_all if s["target"] == target), key=lambda s: s["rate"])
        for ax, (key, sub, _, _) in zip(axes, panels, strict=True):
            ys = [s[key][sub] if sub else s[key] for s in rows]
            ax.plot([s["rate"] for s in rows], [math.nan if y is None else y for y in ys],
                    marker="o", label=target)
    rates = sorted({s["rate"] for s in rows_all})
    for ax, (_, _, ylabel, title) in zip(axes, panels, strict=True):
        ax.set(xlabel=f"offered rate ({unit})", ylabel=ylabel, title=title)
        ax.set_xticks(rates)
        ax.set_ylim(bottom=0)  # absolute scale: differences read as they are
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
