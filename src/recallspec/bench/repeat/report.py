"""Figures, Markdown and plot of ``recallspec bench repeat`` from its request records.

Per (server, workload): output tokens/s = output tokens of the successful requests over
the sum of their wall times (requests run one at a time, so this is the decoding speed
a client sees, prefill included), and accepted tokens per verification step. Per
(drafter, workload): the speedup of the memory arm over the arm without it, and for
the greedy workloads whether every answer is token-identical in both arms (pairs of
requests matched by conversation, turn and sample; a later turn's prompt holds the
arm's own earlier answers, so one difference carries into the turns after it). The
requests the memory can help are also compared alone: code_edit's follow-up turns
and reask's re-sends (its first sends have nothing to recall).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recallspec.bench.common.report import num, pyplot
from recallspec.bench.repeat.workloads import GREEDY_WORKLOADS, WORKLOADS
from recallspec.markdown import table_lines

# The bar for the speedup of the memory arm (Spec-Bench: must not lose).
TARGETS = {"self_consistency": 1.2, "code_edit": 1.5, "spec_bench": 0.98}


def _rate(recs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in recs if r["ok"]]
    tokens = sum(r["output_tokens"] for r in ok)
    secs = sum(r["seconds"] or 0.0 for r in ok)
    steps = sum(r["steps"] or 0 for r in ok)
    accepted = sum((r["mean_acceptance_length"] or 0.0) * (r["steps"] or 0) for r in ok)
    return {"requests": len(recs), "ok": len(ok), "errors": len(recs) - len(ok),
            "output_tokens": tokens, "seconds": round(secs, 3),
            "tok_per_s": tokens / secs if secs > 0 else None,
            "accepted_per_step": accepted / steps if steps else None}


def summaries(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary per (server, workload), in the order the records came; code_edit
    also split into first turns and follow-ups."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["server"], r["workload"]), []).append(r)
    out = []
    for (server, workload), recs in groups.items():
        s = {"server": server, "drafter": recs[0]["drafter"], "memory": recs[0]["memory"],
             "workload": workload, **_rate(recs),
             "error_messages": sorted({r["error"] for r in recs if r["error"]})[:5]}
        if workload == "code_edit":
            s["first_turn"] = _rate([r for r in recs if r["turn"] == 0])
            s["follow_ups"] = _rate([r for r in recs if r["turn"] > 0])
        elif workload == "reask":
            s["first_send"] = _rate([r for r in recs if r["sample"] == 0])
            s["resends"] = _rate([r for r in recs if r["sample"] > 0])
        out.append(s)
    return out


def comparisons(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Memory arm vs the arm without, per (drafter, workload)."""
    arms: dict[tuple[str, str, bool], list[dict[str, Any]]] = {}
    for r in records:
        arms.setdefault((r["drafter"], r["workload"], r["memory"]), []).append(r)
    out = []
    for (drafter, workload, memory), on in arms.items():
        if not memory or (drafter, workload, False) not in arms:
            continue
        off = arms[(drafter, workload, False)]
        a, b = _rate(off), _rate(on)
        c: dict[str, Any] = {
            "drafter": drafter, "workload": workload,
            "tok_per_s_without": a["tok_per_s"], "tok_per_s_with": b["tok_per_s"],
            "speedup": b["tok_per_s"] / a["tok_per_s"]
            if a["tok_per_s"] and b["tok_per_s"] else None,
            "accepted_per_step_without": a["accepted_per_step"],
            "accepted_per_step_with": b["accepted_per_step"],
            "target": TARGETS.get(workload), "identical": None, "compared": None,
        }
        if workload == "code_edit":
            c["follow_up_speedup"] = _ratio(
                _rate([r for r in on if r["turn"] > 0])["tok_per_s"],
                _rate([r for r in off if r["turn"] > 0])["tok_per_s"])
        elif workload == "reask":
            c["resend_speedup"] = _ratio(
                _rate([r for r in on if r["sample"] > 0])["tok_per_s"],
                _rate([r for r in off if r["sample"] > 0])["tok_per_s"])
        # reask too is greedy when its records say T = 0
        if workload in GREEDY_WORKLOADS or all(r.get("temperature") == 0.0 for r in off + on):
            key = ("conversation", "turn", "sample")
            ref = {tuple(r[k] for k in key): r for r in off if r["ok"]}
            pairs = [(ref[t], r) for r in on if r["ok"]
                     and (t := tuple(r[k] for k in key)) in ref]
            c["compared"] = len(pairs)
            c["identical"] = sum(x["token_ids"] == y["token_ids"] for x, y in pairs)
        out.append(c)
    return out


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x and y else None


def render_markdown(rep: dict[str, Any]) -> str:
    cfg, m = rep["config"], rep["machine"]
    lines = [
        "# Response memory on repeating workloads", "",
        f"Requests one at a time through `recallspec serve` (mode {cfg['mode']}): per drafter "
        f"two fresh servers side by side, without the response memory and with it "
        f"(`--memory-tokens {cfg['memory_tokens']}`"
        + (f"; each output kept behind its prompt's last {cfg['memory_prompt_tail']} tokens"
           if cfg.get("memory_prompt_tail") else "")
        + "), each conversation sent to both in turn "
        f"(alternating which goes first); model `{cfg['model'] or 'default'}`, "
        f"{cfg['threads']} threads; machine: {m.get('cpu')}, {m.get('cpus')} CPUs, load "
        f"{m.get('loadavg_1m')} at the start.", "",
        *_workload_lines(cfg), "",
        "max_tokens: " + ", ".join(f"{w} {n}" for w, n in
                                   cfg["max_tokens_per_workload"].items()) + ".", "",
        "tok/s: output tokens over the requests' summed wall time (prefill included). "
        "acc/step: tokens committed per verification step. identical: greedy answers "
        "token-identical with and without the memory.", "",
    ]
    rows = []
    for c in rep["comparisons"]:
        ident = "-" if c["compared"] is None else f"{c['identical']}/{c['compared']}"
        tgt = "-" if c["target"] is None else f">= {c['target']:g}x"
        rows.append([c["workload"], c["drafter"], num(c["tok_per_s_without"], ".1f"),
                     num(c["tok_per_s_with"], ".1f"), f"{num(c['speedup'])}x", tgt,
                     num(c["accepted_per_step_without"]), num(c["accepted_per_step_with"]),
                     ident])
    lines += table_lines(["workload", "drafter", "tok/s without", "tok/s with", "speedup",
                          "target", "acc/step without", "acc/step with", "identical"],
                         rows, "--rrrrrrr")
    for key, what in (("follow_up_speedup", "code_edit follow-up turns alone"),
                      ("resend_speedup", "reask re-sends alone (the first sends have "
                       "nothing to recall)")):
        part = [c for c in rep["comparisons"] if c.get(key) is not None]
        if part:
            lines += ["", f"{what}: " + ", ".join(
                f"{c['drafter']} {c[key]:.2f}x" for c in part) + "."]
    order = {w: i for i, w in enumerate(WORKLOADS)}
    rows = [[s["server"], s["workload"], str(s["requests"]), str(s["errors"]),
             str(s["output_tokens"]), f"{s['seconds']:.1f}", num(s["tok_per_s"], ".1f"),
             num(s["accepted_per_step"])]
            for s in sorted(rep["summaries"], key=lambda s: (order.get(s["workload"], 9),
                                                             s["drafter"], s["memory"]))]
    lines += ["", *table_lines(["server", "workload", "requests", "errors", "tokens",
                                "seconds", "tok/s", "acc/step"], rows, "--rrrrrr")]
    mem = [(n, i) for n, i in rep["servers"].items()
           if i.get("memory_tokens") and i.get("memory_gauges")]
    if mem:
        lines += ["", "Response memory at the end of each memory run (budget per tenant):", ""]
        for name, info in mem:
            g = info["memory_gauges"]
            lines.append(
                f"- {name}: {g.get('recallspec:memory_tokens', 0):.0f} tokens in "
                f"{g.get('recallspec:memory_tenants', 0):.0f} tenants, budget "
                f"{g.get('recallspec:memory_budget_tokens', 0):.0f}, "
                f"{g.get('recallspec:memory_evictions_total', 0):.0f} evictions")
    failed = [f"- {n}: {i['failed']}" for n, i in rep["servers"].items() if i.get("failed")]
    errs = [f"- {s['server']} {s['workload']}: {msg}" for s in rep["summaries"]
            for msg in s["error_messages"]]
    if failed or errs:
        lines += ["", "Failures:", "", *failed, *errs]
    return "\n".join(lines) + "\n"


def _workload_lines(cfg: dict[str, Any]) -> list[str]:
    """One line per workload run, saying what it repeats and where the repetition is."""
    text = {
        "self_consistency": f"- self_consistency: {cfg['questions']} GSM8K test questions x "
        f"{cfg['samples']} samples at T = {cfg['temperature']} (seeds 0..{cfg['samples'] - 1}), "
        f"tenant per {'question' if cfg['tenancy'] == 'question' else 'run'};",
        "code_edit": f"- code_edit: {cfg['tasks']} HumanEval / MBPP tasks + "
        f"{cfg['follow_ups']} follow-up turns (rename, docstring, unit test), greedy, "
        + ("each with the conversation so far (the previous answer is in the prompt: the "
           "request's own automaton drafts it, the memory adds nothing);"
           if cfg.get("code_edit_history", True) else
           "each a fresh conversation restating the task (the previous answer is only in "
           "the memory);"),
        "reask": f"- reask: {cfg.get('reask_prompts')} Spec-Bench first turns (not the "
        f"control's), each sent {cfg.get('reask_times')} times in a row in a fresh "
        f"conversation at T = {cfg.get('reask_temperature')}"
        f"{' (greedy)' if cfg.get('reask_temperature') == 0 else ''}, one tenant (a user "
        "pressing regenerate, an agent retrying: the repetition is only in the memory);",
        "spec_bench": f"- spec_bench: {cfg['prompts']} Spec-Bench first turns, greedy, one "
        "tenant (control).",
    }
    return [text[w] for w in cfg.get("workloads", list(text)) if w in text]


def write_plot(rep: dict[str, Any], path: Path) -> bool:
    """Speedup of the memory arm per workload, a bar per drafter, the issue's targets
    as ticks; False without matplotlib or results."""
    plt = pyplot()
    if plt is None:
        return False
    comps = [c for c in rep["comparisons"] if c["speedup"] is not None]
    if not comps:
        return False
    workloads = list(dict.fromkeys(c["workload"] for c in comps))
    drafters = list(dict.fromkeys(c["drafter"] for c in comps))
    width = 0.8 / len(drafters)
    fig, ax = plt.subplots(figsize=(2.2 + 2.0 * len(workloads), 4))
    for j, d in enumerate(drafters):
        xs, ys = [], []
        for i, w in enumerate(workloads):
            c = next((c for c in comps if c["drafter"] == d and c["workload"] == w), None)
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(c["speedup"] if c else math.nan)
        ax.bar(xs, ys, width, label=d)
    for i, w in enumerate(workloads):
        if w in TARGETS:
            ax.hlines(TARGETS[w], i - 0.45, i + 0.45, colors="k", linestyles="dashed",
                      linewidth=1)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set(ylabel="tokens/s with memory / without", title="response memory: speedup "
           "(dashed: target)")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
