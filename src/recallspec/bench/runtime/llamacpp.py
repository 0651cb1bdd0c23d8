"""llama.cpp's side of ``recallspec bench runtime``: native llama.cpp (``make peers``).

The same GGUF file, prompt ids, thread count and token counts as our runs, flash
attention on (``bench/common/llamacpp.py``):

* ``bench``: ``llama-bench`` rates as users quote them: tg (``-n NEW -p 0``, decoding
  NEW tokens on an empty cache) and pp (``-p 512 -n 0``), ``repeats`` runs each.
* ``cost_ms``: the verification cost curve, as ``bench scale`` measures it
  (``bench/common/llamacpp.server_cost_curve``): llama-server's own time to evaluate k new
  prompt tokens on CACHED tokens in its prompt cache (median of ``repeats``). It computes
  logits for a batch's last row only, so this is a lower bound of verifying k drafted
  tokens (every row's logits).
* ``greedy``: end to end through ``llama-server`` (``/completion`` with our prompt ids,
  prompt cache off, EOS banned so every run emits exactly NEW tokens), timed by the
  server itself: e2e = prompt_ms + predicted_ms, prefill = prompt_ms (up to the first
  token) and decode = (predicted_n - 1) / predicted_ms, as ours is (N - 1) / (time(N) -
  time(1)). Median of ``repeats`` after a warm-up; the client-side time is kept too.
* ``info``: peer.json (commit, cmake flags, compilers) and the server's system_info.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from recallspec.bench.common.llamacpp import (
    LlamaCppError,
    LlamaServer,
    ServerConfig,
    available,
    llama_bench,
    peer_info,
    server_cost_curve,
)
from recallspec.bench.common.report import cmake_flags

PP_TOKENS = 512


def llamacpp_runtime(
    gguf: str, ids: list[int], *, new_tokens: int, repeats: int, ks: tuple[int, ...],
    cached: int, threads: int, say: Callable[[str], None],
) -> dict[str, Any] | None:
    """{"info", "bench": {"tg", "pp"}, "cost_ms": {k: ms}, "greedy": rates}, or None when
    the peer is not built (said once). A failing part is said and the rest returned."""
    if not available():
        say("llama.cpp: native llama.cpp is not built (make peers); skipped")
        return None
    out: dict[str, Any] = {"info": peer_info()}
    try:
        say(f"llama.cpp llama-bench: tg{new_tokens}, pp{PP_TOKENS}")
        tg = _one(llama_bench(gguf, threads, n=new_tokens, repeats=repeats))
        pp = _one(llama_bench(gguf, threads, p=PP_TOKENS, repeats=repeats))
        out["bench"] = {"tg": tg, "pp": pp}
        say(f"llama.cpp greedy and verification cost curve (llama-server, {cached} cached)")
        ctx = max(1024, len(ids) + new_tokens + 8, cached + max(ks) + 8)
        with LlamaServer(ServerConfig(gguf, threads, ctx_per_slot=ctx)) as server:
            out["info"] = server.info
            out["greedy"] = _greedy(server, ids, new_tokens, repeats)
            out["cost_ms"] = server_cost_curve(server, ks, cached=cached, repeats=repeats)
    except LlamaCppError as e:
        say(f"llama.cpp failed: {e}")
    return out


def _one(rows: list[dict[str, Any]]) -> dict[str, Any]:
    if len(rows) != 1:
        raise LlamaCppError(f"llama-bench wrote {len(rows)} rows for one test")
    return rows[0]


def _greedy(server: LlamaServer, ids: list[int], n: int, repeats: int) -> dict[str, float]:
    runs = [server.complete(ids, n, ignore_eos=True) for _ in range(repeats + 1)][1:]
    for c in runs:
        if c.timings.get("predicted_n") != n:
            raise LlamaCppError(f"llama-server generated {c.timings.get('predicted_n')} "
                                f"tokens, asked for {n}")
    e2e = statistics.median(c.server_s for c in runs)
    prefill = statistics.median(c.timings["prompt_ms"] / 1e3 for c in runs)
    dec = statistics.median(c.timings["predicted_ms"] / 1e3 for c in runs)
    return {"e2e_s": e2e, "prefill_s": prefill, "e2e_tok_s": n / e2e,
            "decode_tok_s": (n - 1) / max(dec, 1e-9),
            "decode_ms_per_tok": 1000 * dec / max(n - 1, 1),
            "client_e2e_s": statistics.median(c.client_s for c in runs),
            "prompt_n": statistics.median(c.timings.get("prompt_n", 0.0) for c in runs)}


def table_rows(lc: dict[str, Any]) -> list[list[str]]:
    """The engines table's llama.cpp rows (9 cells each, as ``render_runtime_markdown``'s)."""
    rows = []
    g = lc.get("greedy")
    if g:
        rows.append(["llama.cpp llama-server greedy (same GGUF)", f"{g['decode_tok_s']:.1f}",
                     f"{g['e2e_tok_s']:.1f}", "1.00x", "1.00x", *[""] * 4])
    b = lc.get("bench", {})
    if "tg" in b:
        tg = b["tg"]
        rows.append([f"llama.cpp llama-bench tg{tg['n_gen']}",
                     f"{tg['avg_ts']:.1f} ± {tg['stddev_ts']:.1f}", *[""] * 7])
    if "pp" in b:
        pp = b["pp"]
        rows.append([f"llama.cpp llama-bench pp{pp['n_prompt']} (prefill tok/s)",
                     f"{pp['avg_ts']:.1f} ± {pp['stddev_ts']:.1f}", *[""] * 7])
    return rows


def describe(lc: dict[str, Any]) -> str:
    """One line: which llama.cpp, built how, seeing which instruction sets."""
    info = lc.get("info", {})
    flags = cmake_flags(info)
    return (f"llama.cpp: commit {info.get('llama_cpp_commit', '?')} (vendored by "
            f"llama-cpp-python {info.get('llama_cpp_python', '?')}), native build "
            f"`{flags}`, {info.get('cxx_compiler', '?')}; "
            f"{info.get('system_info', 'system_info not recorded')}")
