"""Markdown and plot of ``recallspec bench scale`` (``bench/scale/command.py``'s scale.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recallspec.bench.common.report import cmake_flags, num, pyplot
from recallspec.bench.common.shapes import get_shape
from recallspec.errors import UnknownNameError
from recallspec.markdown import table_lines

_HEADER = ("shape", "quant", "params", "file MB", "decode ours / llama.cpp tok/s", "ratio",
           "prefill ours / llama.cpp tok/s", "ratio", "k=8 / k=1 ours (llama.cpp)",
           "k=16 / k=1 ours (llama.cpp)", "ours GB/s (of stream)", "ours RSS / file",
           "llama.cpp RSS MB", "load s ours / llama.cpp",
           "TTFT s ours first / later / llama-server (first, later vs llama-server)")


def _nan(vs: list[Any]) -> list[float]:
    """Plot values: a missing one (None) is a gap."""
    return [float("nan") if v is None else float(v) for v in vs]


def _params_b(entry: dict[str, Any]) -> float | None:
    try:  # (a reduced shape, <name>-L<n>, too: its own parameters)
        return get_shape(entry["shape"]).parameters() / 1e9
    except UnknownNameError:
        return None


def _peer_line(peer: dict[str, Any]) -> str:
    if not peer or "error" in peer:
        return f"Peer: native llama.cpp not measured ({peer.get('error', 'off')})."
    return (f"Peer: native llama.cpp, commit {peer.get('llama_cpp_commit')} (vendored by "
            f"llama-cpp-python {peer.get('llama_cpp_python')}), built with "
            f"`{cmake_flags(peer)}`; {peer.get('system_info', '')}.")


def render_scale_markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    peer = res.get("peer") or {}
    cfg = res["config"]
    lines = [
        f"Machine: {m['cpu']}, {m['cpus']} CPUs; {m.get('kernels', '')}; {res['date']}; "
        f"1-min load {m.get('loadavg_1m')} at the start.",
        _peer_line(peer),
        f"Random-weight GGUFs at published shapes (speed is data-independent in both "
        f"engines). Decode: {cfg['new_tokens']} tokens after a ~100-token prompt "
        f"(ours: time(N) - time(1); llama.cpp: llama-bench tg{cfg['new_tokens']}); "
        f"prefill: a {cfg['prefill']}-token prompt (llama-bench pp{cfg['prefill']}); "
        f"verification: one forward of k new rows on {cfg['cached']} cached tokens "
        f"(ours: every row's logits; llama.cpp: llama-server's prompt eval of k tokens on "
        f"its cached {cfg['cached']}, last row's logits). Medians of {cfg['repeats']}. "
        "TTFT: process start to the first token, ours on the first run of a file "
        "(conversion, repack) and a later run (the repack cache), llama-server's from its "
        "start (`bench/scale/cold_start.py`).",
        "",
    ]
    rows: list[list[str]] = []
    for e in res["entries"].values():
        o, lc, d = e.get("ours", {}), e.get("llamacpp", {}), e.get("derived", {})
        cr, lcr = d.get("cost_ratio", {}), d.get("llamacpp_cost_ratio", {})
        ar = o.get("ar", {})
        frac = d.get("bandwidth_fraction")
        pct = None if frac is None else 100 * frac
        rows.append([
            e["shape"], e["quant"], num(_params_b(e), ".2f", "B"), f"{e['file_bytes'] / 1e6:,.0f}",
            f"{num(ar.get('decode_tok_s'), '.1f')} / {num(lc.get('tg_tok_s'), '.1f')}",
            num(d.get("decode_vs_llamacpp"), ".2f", "x"),
            f"{num(o.get('prefill_tok_s'), '.1f')} / {num(lc.get('pp_tok_s'), '.1f')}",
            num(d.get("prefill_vs_llamacpp"), ".2f", "x"),
            f"{num(cr.get('8'), '.2f', 'x')} ({num(lcr.get('8'), '.2f', 'x')})",
            f"{num(cr.get('16'), '.2f', 'x')} ({num(lcr.get('16'), '.2f', 'x')})",
            f"{num(o.get('achieved_gb_s'), '.1f')} ({num(pct, '.0f', '%')})",
            num(d.get("rss_vs_file"), ".2f", "x"), num(lc.get("rss_mb"), ",.0f"),
            f"{num(o.get('load_s'), '.1f')} / {num(lc.get('start_s'), '.1f')}", _ttft_cell(e)])
        if "error" in o or "error" in lc:
            errors = f"errors: {o.get('error', '')} {lc.get('error', '')}"
            rows.append(["", errors, *[""] * (len(_HEADER) - 2)])
    lines += table_lines(_HEADER, rows)
    for measure, peer in (("decode", "tg"), ("prefill", "pp")):
        paired = [(e, e["derived"][f"{measure}_vs_llamacpp_paired"])
                  for e in res["entries"].values()
                  if e.get("derived", {}).get(f"{measure}_vs_llamacpp_paired")]
        if paired:
            lines += ["", f"{measure.capitalize()} in paired rounds (ours, a fresh process, and "
                      f"llama-bench {peer}, back to back, the order alternating), ours / "
                      "llama.cpp: " + "; ".join(
                          f"{e['shape']} {e['quant']} {num(p['median'], '.2f', 'x')} (median "
                          f"of {p['rounds']}, {num(p['min'], '.2f', 'x')}-"
                          f"{num(p['max'], '.2f', 'x')})"
                          for e, p in paired) + "."]
    s = res.get("stream", {})
    after = res.get("stream_after", {})
    # (runs before 2026-12-04 have no sum_gb_s: their read_gb_s was torch's sum)
    how = ("the products' way, prefetching; torch's sum "
           f"{num(s.get('sum_gb_s'), '.1f')} / {num(after.get('sum_gb_s'), '.1f')}"
           if "sum_gb_s" in s else "torch's sum")
    lines += ["", f"Streaming read bandwidth in the run: {num(s.get('read_gb_s'), '.1f')} GB/s "
              f"at the start, {num(after.get('read_gb_s'), '.1f')} GB/s "
              f"at the end ({how}; {num(s.get('buffer_mib'), '.0f')} MiB buffer). RSS: the "
              "whole process (ours includes Python and torch: see baseline_rss_mb in "
              "scale.json)."]
    lines += _curve_table(res)
    lines += _experts_table(res)
    lines += _batched_table(res)
    lines += _prediction_table(res)
    return "\n".join(lines) + "\n"


def _ttft_cell(entry: dict[str, Any]) -> str:
    t = entry.get("ttft")
    if not t:
        return "-"
    if "error" in t:
        return "failed"
    s = t["summary"]
    return (f"{num(s['ours_first_token_s'])} / {num(s['ours_later_token_s'])} / "
            f"{num(s['llamacpp_first_token_s'])} "
            f"({num(s['first_vs_llamacpp'], '.2f', 'x')}, "
            f"{num(s['later_vs_llamacpp'], '.2f', 'x')})")


def _curve_table(res: dict[str, Any]) -> list[str]:
    ks = [str(k) for k in res["config"]["ks"]]
    rows = []
    for e in res["entries"].values():
        oc = e.get("ours", {}).get("cost_ms", {})
        lc = e.get("llamacpp", {}).get("cost_ms", {})
        rows.append([e["shape"], e["quant"],
                     *(f"{num(oc.get(k), '.1f')} | {num(lc.get(k), '.1f')}" for k in ks)])
    return ["", "Verification cost, ms (ours | llama.cpp):", "",
            *table_lines(["shape", "quant", *(f"k={k}" for k in ks)], rows)]


def _experts_table(res: dict[str, Any]) -> list[str]:
    """A mixture of experts' distinct experts woken per layer by a forward of k rows
    (``ours.experts_touched``), and what one token reads."""
    ks = [str(k) for k in res["config"]["ks"]]
    rows = []
    for e in res["entries"].values():
        o = e.get("ours", {})
        t, u = o.get("experts_touched"), o.get("experts_uniform", {})
        if not t:
            continue
        wb = o.get("weight_bytes", {})
        rows.append([e["shape"], e["quant"], f"{o.get('experts_used')} of {o.get('experts')}",
                     f"{num(wb.get('experts_read', 0) / 1e6, ',.0f')} of "
                     f"{num(wb.get('experts', 0) / 1e6, ',.0f')}",
                     *(f"{num(t.get(k), '.1f')} ({num(u.get(k), '.1f')})" for k in ks)])
    if not rows:
        return []
    return ["", "Experts a forward of k rows wakes, per layer (a chain of random tokens; in "
            "brackets: independent uniform routing, E(1 - (1 - K/E)^k)); expert MB one token "
            "reads of those resident:", "",
            *table_lines(["shape", "quant", "experts used", "expert MB read",
                          *(f"k={k}" for k in ks)], rows)]


def _batched_table(res: dict[str, Any]) -> list[str]:
    """The batched verification curve (``ours.batched``, ``bench/scale/moe_batch.py``):
    one forward of B sequences' chains of k rows, beside one sequence's chain of B x k
    rows, the experts each woke and the cost model's price of it."""
    rows, notes, per_seq, how = [], [], [], None
    for e in res["entries"].values():
        b = e.get("ours", {}).get("batched")
        if not b:
            continue
        how = how or b
        per_seq.append(f"{e['shape']} {e['quant']} {num(b.get('per_seq_ms'), '.2f')} ms")
        notes += [n for n in b.get("notes", []) if n not in notes]
        for p in b["points"]:
            one = p.get("one_seq_ms")
            ratio = p["ms"] / one if one else None
            experts = ("-" if p.get("experts") is None else
                       f"{num(p['experts'], '.1f')} ({num(p.get('one_seq_experts'), '.1f')}; "
                       f"{num(p.get('uniform'), '.1f')})")
            rows.append([e["shape"], e["quant"], f"{p['seqs']} x {p['k']}", str(p["rows"]),
                         num(p["ms"], ".1f"), f"{num(one, '.1f')} ({num(ratio, '.2f', 'x')})",
                         experts,
                         f"{num(p.get('priced_ms'), '.1f')} / "
                         f"{num(p.get('priced_routed_ms'), '.1f')}"])
    if not rows or how is None:
        return []
    return ["", f"Batched verification: one forward of B sequences, each its own slot and "
            f"context of {how['cached']} random tokens, each a chain of k rows (every row's "
            f"logits), ms per forward (median of {how['repeats']}), beside one sequence's "
            "chain of the same B x k rows (in brackets: batched over it); distinct experts "
            f"per layer the batched forward woke (the mean over {how['samples']} forwards; in "
            "brackets: the one chain's, and independent uniform routing's E(1 - (1 - K/E)^(B "
            "k))); the cost model's price of the forward, ms, at the calibration's routing / "
            f"at this forward's (per_seq: {'; '.join(per_seq)}). Native "
            "llama.cpp's batched cost is not measured: llama-bench has no mode for one "
            "forward of several sequences' draft rows.", "",
            *table_lines(["shape", "quant", "B x k", "rows", "ms", "one sequence ms",
                          "experts (one sequence; uniform)", "priced ms (calibrated / routed)"],
                         rows),
            "", *(f"- {n}" for n in notes)]


def _prediction_table(res: dict[str, Any]) -> list[str]:
    p = res.get("prediction")
    if not p:
        return []
    methods = [m for m in res["config"]["methods"] if m != "ar"]
    rows = []
    bounds = p.get("bounds", {})
    moe = {k for by_key in bounds.values() for k in by_key}
    for key, pred, label in (
            *((k, v, " (measured routing)" if k in moe else "")
              for k, v in p["entries"].items()),
            *((k, v, f" ({bound}, estimated)") for bound, by_key in bounds.items()
              for k, v in by_key.items())):
        e = res["entries"][key]
        tg = e.get("llamacpp", {}).get("tg_tok_s")
        best = max((pred[m]["tokens_per_s"] for m in pred), default=None)
        cells = [f"{pred[m]['tokens_per_s']:.1f} ({num(pred[m]['speedup_vs_ar'], '.2f', 'x')}, "
                 f"d {num(pred[m]['drafted'], '.1f')})" if m in pred else "" for m in methods]
        rows.append([e["shape"] + label, e["quant"], f"{pred['ar']['tokens_per_s']:.1f}", *cells,
                     num(best / tg if best and tg else None, ".2f", "x")])
    errors = ", ".join(
        f"{m} {num(100 * c['error'] if c['error'] is not None else None, '+.1f', '%')}"
        for m, c in p["replay_error_on_real_run"].items())
    return ["", f"**Predicted** Spec-Bench tokens/s (a prediction, not a measurement): the "
            f"{p['questions']} recorded answers of {p['model']} ({p['answers']}) replayed "
            "exactly, priced with each shape's measured cost curve; speedup over our AR at "
            "that shape, and over llama.cpp's measured tg (its greedy decoding). The replay's "
            f"error on the real run: {errors}.", "",
            *table_lines(["shape", "quant", "ar tok/s", *methods, "best vs llama.cpp tg"], rows),
            "", "d = draft rows per step the cost-aware sizing chose at that shape."
            + (" A mixture of experts at its measured curve (the experts a random router "
               "woke for random tokens) and re-priced at two routing bounds "
               "(`bench/scale/moe.py`): uniform (rows route independently and uniformly) "
               "and full overlap (draft rows wake the experts of the row before), each "
               "expert streamed at the run's decode bandwidth." if bounds else "")]


def plot_scale(res: dict[str, Any], path: Path) -> None:
    """Decode tok/s against parameters, ours and llama.cpp, per quantization (plus the
    predicted speculative speed of our best method where predicted)."""
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    by_quant: dict[str, list[dict[str, Any]]] = {}
    for e in res["entries"].values():
        by_quant.setdefault(e["quant"], []).append(e)
    pred = (res.get("prediction") or {}).get("entries", {})
    for q, es in sorted(by_quant.items()):
        es = sorted(es, key=lambda e: _params_b(e) or 0.0)
        xs = _nan([_params_b(e) for e in es])
        ours = [e.get("ours", {}).get("ar", {}).get("decode_tok_s") for e in es]
        lc = [e.get("llamacpp", {}).get("tg_tok_s") for e in es]
        ax.plot(xs, _nan(ours), marker="o", label=f"ours AR {q}")
        if any(v is not None for v in lc):
            ax.plot(xs, _nan(lc), marker="s", linestyle="--", label=f"llama.cpp tg {q}")
        sp = [max((v["tokens_per_s"] for v in pred.get(f"{e['shape']}:{q}", {}).values()),
                  default=None) for e in es]
        if any(v is not None for v in sp):
            ax.plot(xs, _nan(sp), marker="^", linestyle=":",
                    label=f"ours best method {q} (predicted)")
    # matplotlib is optional: imported only once ``pyplot()`` found it.
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    # Plain numbers at a few ticks: log axes' default labels (4x10^-1 ...) overlap.
    ax.set_xticks([0.25, 0.5, 1, 2, 4, 8])
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("parameters (billions)")
    ax.set_ylabel("tokens/s (2 threads)" if res["config"].get("threads") in (None, 2)
                  else "tokens/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
