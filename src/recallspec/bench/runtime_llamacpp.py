"""llama.cpp's side of ``recallspec bench runtime``, measured in a child process.

The same GGUF file, prompt ids, thread count and token counts as our runs: greedy AR
decoding opened as a user opens it for that (``logits_all=False``), end to end and
decode-only (time(N) - time(1)), and its verification cost curve (one ``eval`` of k
tokens after ``cached`` tokens, from a model opened with ``logits_all=True``: verifying a
draft needs every position's logits).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from recallspec.bench.methods import llamacpp_available
from recallspec.spec.sampling import SamplingParams


def llamacpp_runtime(
    gguf: str, tokenizer: Any, ids: list[int], ctx_tokens: list[int], *, new_tokens: int,
    repeats: int, ks: tuple[int, ...], cached: int, threads: int,
    say: Callable[[str], None],
) -> dict[str, Any] | None:
    """{"greedy": rates, "cost_ms": {k: ms}, "info": {...}} or None when llama-cpp-python
    is not installed or its process crashed (said once)."""
    from recallspec.bench.peers import ChildMethod, PeerError, peer_command

    if not llamacpp_available():
        say("llama.cpp: llama-cpp-python is not installed (make peers); skipped")
        return None
    out: dict[str, Any] = {}
    try:
        say("llama.cpp greedy (child process, logits_all=False)")
        greedy = ChildMethod("llamacpp-greedy",
                             peer_command("llamacpp-greedy", gguf, threads), tokenizer,
                             "llamacpp-greedy")
        try:
            out["info"] = greedy.info

            def timed(n: int) -> float:
                p = SamplingParams(max_new_tokens=n, ignore_eos=True)
                ts = [greedy.generate(ids, p).wall_time for _ in range(repeats + 1)]
                return statistics.median(ts[1:])  # the first is a warm-up

            t_n, t_1 = timed(new_tokens), timed(1)
        finally:
            greedy.close()
        dec = max(t_n - t_1, 1e-9)
        out["greedy"] = {"e2e_s": t_n, "prefill_s": t_1, "e2e_tok_s": new_tokens / t_n,
                         "decode_tok_s": (new_tokens - 1) / dec,
                         "decode_ms_per_tok": 1000 * dec / (new_tokens - 1)}
        say("llama.cpp verification cost curve (child process, logits_all=True)")
        lookup = ChildMethod("llamacpp-pld", peer_command("llamacpp-pld", gguf, threads),
                             tokenizer, "llamacpp-greedy")
        try:
            r = lookup.request({"op": "eval_cost", "tokens": ctx_tokens, "cached": cached,
                                "ks": list(ks), "repeats": repeats})
        finally:
            lookup.close()
        out["cost_ms"] = {str(k): float(v) for k, v in r["cost_ms"].items()}
    except PeerError as e:
        say(f"llama.cpp failed: {e}")
        return out or None
    return out
