"""Native llama.cpp's side of ``recallspec bench scale`` for one GGUF.

* ``llama-bench`` tg (``new_tokens``) and pp (``prefill``), medians of ``repeats``
  (llama-bench reports the mean; with its samples we take the median as ours);
* ``llama-server`` (one slot, flash attention, same threads): seconds from start to
  ``/health`` answering, its resident memory after the curve, and the verification cost
  curve on ``cached`` tokens (``bench/common/llamacpp.server_cost_curve``: its prompt
  eval computes the last row's logits only, so a verification that needs every row's,
  as ours computes, would cost a little more there).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recallspec.bench.common import llamacpp as lc
from recallspec.bench.common.machine import status_mb
from recallspec.bench.scale.config import ScaleConfig


def peer_description() -> dict[str, Any]:
    """The peer's build record (commit, cmake flags, compiler) or why there is none."""
    try:
        return lc.peer_info()
    except lc.PeerNotBuilt as e:
        return {"error": str(e)}


def _median_ts(row: dict[str, Any], tokens: int) -> float:
    """Tokens/s of a llama-bench row: the median over its samples (avg_ts otherwise)."""
    ns = row.get("samples_ns") or []
    return tokens / (statistics.median(ns) / 1e9) if ns else float(row["avg_ts"])


def _rate(rows: list[dict[str, Any]], p: int, n: int) -> float | None:
    """Tokens/s of llama-bench's pp``p`` (``n`` = 0) or tg``n`` (``p`` = 0) row among
    ``rows`` (``_median_ts``), None where it wrote none."""
    for r in rows:
        if int(r["n_prompt"]) == p and int(r["n_gen"]) == n:
            return _median_ts(r, p or n)
    return None


def _bench(gguf: Path, cfg: ScaleConfig, threads: int) -> dict[str, Any]:
    rows = lc.llama_bench(str(gguf), threads, p=cfg.prefill, n=cfg.new_tokens,
                          repeats=cfg.repeats)
    out: dict[str, Any] = {"llama_bench_rows": [
        {k: r.get(k) for k in ("n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts",
                               "samples_ns", "build_commit", "cpu_info", "n_threads")}
        for r in rows]}
    for key, (p, n) in (("tg_tok_s", (0, cfg.new_tokens)), ("pp_tok_s", (cfg.prefill, 0))):
        rate = _rate(rows, p, n)
        if rate is not None:
            out[key] = rate
    return out


def one_rate(gguf: Path, threads: int, measure: str, tokens: int, repeats: int) -> float:
    """llama-bench's tg (``measure`` "decode") or pp ("prefill") of ``tokens``, the median of
    ``repeats`` (one side of a paired round, ``bench/scale/command.paired_rounds``)."""
    p, n = (tokens, 0) if measure == "prefill" else (0, tokens)
    rate = _rate(lc.llama_bench(str(gguf), threads, p=p, n=n, repeats=repeats), p, n)
    if rate is None:
        raise lc.LlamaCppError(f"llama-bench wrote no {'pp' if p else 'tg'}{tokens} row")
    return rate


def _server_curve(gguf: Path, cfg: ScaleConfig, threads: int) -> dict[str, Any]:
    # (--swa-full: the curve is k new rows on a cached prefix, which a sliding-window
    # model's smaller cache would re-evaluate in part.)
    scfg = lc.ServerConfig(str(gguf), threads, ctx_per_slot=cfg.cached + max(cfg.ks) + 64,
                           swa_full=True)
    t0 = time.perf_counter()
    with lc.LlamaServer(scfg) as srv:
        out: dict[str, Any] = {"start_s": time.perf_counter() - t0,
                               "system_info": srv.system_info}
        out["cost_ms"] = lc.server_cost_curve(srv, cfg.ks, cached=cfg.cached, repeats=cfg.repeats)
        out["rss_mb"] = status_mb("VmRSS", srv.pid)
    return out


def llamacpp_side(gguf: Path, cfg: ScaleConfig, threads: int | None,
                  say: Callable[[str], None]) -> dict[str, Any]:
    """{"tg_tok_s", "pp_tok_s", "cost_ms", "rss_mb", "start_s", ...} or {"error": ...}
    (a failed peer is reported and the run goes on)."""
    t = threads or os.cpu_count() or 1
    try:
        out = _bench(gguf, cfg, t)
        out.update(_server_curve(gguf, cfg, t))
        out["threads"] = t
        return out
    except (lc.LlamaCppError, lc.PeerNotBuilt) as e:
        say(f"  llama.cpp failed: {e}")
        return {"error": str(e)}
