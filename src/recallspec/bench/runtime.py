"""`recallspec bench runtime`: how fast our forward is, measured in one run.

Three measurements, each the median of ``repeats`` timings after a warm-up:

1. AR decoding tokens/s: our engine (drafter none, greedy, EOS ignored so every run
   emits exactly ``new_tokens``) for each weight format (quantized: the GGUF's own
   blocks; float32: the reference), vs transformers ``generate`` on the fp32 weights
   and vs native llama.cpp on the same GGUF (``llama-server`` greedy timed by the
   server, and ``llama-bench`` tg / pp; ``bench/runtime_llamacpp.py``), same prompt ids
   and threads. Reported end-to-end (prefill included) and decode-only (time(N) -
   time(1) for the N - 1 tokens after the first).
2. Verification cost curve: one forward of a chain of k new tokens (all rows with
   logits, as the engine's verification) on top of 512 cached tokens, as ms and as
   a ratio to k = 1; transformers' forward at k = 1 and 16 with a 512-token cache and
   llama.cpp's (``llama-bench -p k -d 512``) for reference.
3. Achieved memory bandwidth: weight bytes one decode step reads (every parameter
   once; the embedding table only one row unless it is also the lm_head) / decode
   time per token, vs a streaming read bandwidth measured in the same run on a buffer
   far larger than the caches, written before timing (untouched pages read as zeros
   from one shared page and would fake a huge bandwidth).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from recallspec.errors import DataError
from recallspec.runtime.cost_calibration import median_time as _median_time

KS = (1, 2, 4, 8, 16, 32, 64, 128)
CACHED = 512
PROMPT_TOKENS = 100
# The prompt text repeats until it has PROMPT_TOKENS tokens (written for this project).
_PROMPT_TEXT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle. "
    "The story should describe the island, the weather, the keeper's daily routine and "
    "the moment the bottle arrives, and end with the keeper deciding what to do next. "
)


@dataclass(frozen=True)
class RuntimeConfig:
    model: str | None = None
    repeats: int = 5
    new_tokens: int = 128
    dtypes: tuple[str, ...] = ("quantized", "float32")
    hf: bool = True  # compare with transformers (on the fp32 weights)
    llamacpp: bool = True  # compare with native llama.cpp (when `make peers` built it)
    ks: tuple[int, ...] = KS
    cached: int = CACHED
    stream_mib: int = 1024  # streaming-bandwidth buffer (>> L3)
    threads: int | None = None  # torch threads (None = torch's default)

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.new_tokens < 2:
            raise DataError("need repeats >= 1 and new_tokens >= 2")
        bad = [d for d in self.dtypes if d not in ("quantized", "float32", "bfloat16")]
        if bad or not self.dtypes:
            raise DataError(
                f"dtypes must be among quantized, float32, bfloat16; got {self.dtypes}"
            )


# ---- memory bandwidth -------------------------------------------------------------


def stream_bandwidth(mib: int, repeats: int) -> dict[str, float]:
    """GB/s of a full read (sum) and of a copy (read + write) over ``mib`` MiB."""
    n = mib * (1 << 20) // 4
    src = torch.empty(n, dtype=torch.float32)
    src.fill_(1.0)  # touch every page: fresh zero pages would all map one physical page
    dst = torch.empty_like(src)
    dst.fill_(0.0)
    t_sum = _median_time(lambda: src.sum(), repeats)
    t_copy = _median_time(lambda: dst.copy_(src), repeats)
    nbytes = n * 4
    return {"buffer_mib": float(mib), "read_gb_s": nbytes / t_sum / 1e9,
            "copy_gb_s": 2 * nbytes / t_copy / 1e9}


def weight_bytes_per_token(model: torch.nn.Module, vocab: int, hidden: int) -> dict[str, int]:
    """Bytes of parameters one decode step reads (shared tensors counted once).

    A [vocab, hidden] matrix is the lm_head (read whole) or the input embedding (one row
    read); with tied embeddings the single such tensor is the lm_head.
    """
    seen: set[int] = set()
    tables: list[torch.Tensor] = []
    other = 0
    # Our model keeps weights as buffers (inference only); a peer's are parameters.
    for p in [*model.parameters(), *model.buffers()]:
        if p.data_ptr() in seen or not p.is_floating_point():
            continue
        seen.add(p.data_ptr())
        if p.ndim == 2 and tuple(p.shape) == (vocab, hidden):
            tables.append(p)
        else:
            other += p.numel() * p.element_size()
    if not tables:
        raise DataError("could not find the embedding / lm_head matrix")
    es = tables[0].element_size()
    lm_head = vocab * hidden * es
    embed_row = hidden * es
    return {"total": other + lm_head + embed_row, "lm_head": lm_head, "other": other,
            "tied": int(len(tables) == 1)}


def quantized_bytes_per_token(model: Any) -> dict[str, int]:
    """``weight_bytes_per_token`` for a model whose matrices are ``QuantizedWeight``s."""
    resident = int(model.weight_bytes())
    embed, head = model.embed_w, model.lm_head_w
    row = embed.nbytes // embed.n  # one embedding row per token
    tied = int(embed is head)
    other = resident - head.nbytes - (0 if tied else embed.nbytes)
    return {"total": other + head.nbytes + row, "lm_head": int(head.nbytes), "other": other,
            "tied": tied}


# ---- our model ----------------------------------------------------------------------


def prompt_ids(tokenizer: Any) -> list[int]:
    """The bench's prompt (``_PROMPT_TEXT`` repeated to at least ``PROMPT_TOKENS``
    tokens) as chat-template token ids: what AR decoding is timed after (here and in
    ``bench/scale_ours.py``)."""
    from recallspec.bench.prompting import conversation_ids

    ids: list[int] = []
    text = _PROMPT_TEXT
    while len(ids) < PROMPT_TOKENS:
        ids = conversation_ids(tokenizer, [text], [])
        text += _PROMPT_TEXT
    return ids


def engine_ar(engine: Any, ids: list[int], n: int, repeats: int) -> dict[str, float]:
    """AR decoding of ``engine``, end to end and decode only (seconds, tok/s, ms/token):
    ``n`` greedy tokens after ``ids``, EOS ignored, no drafter; each the median of
    ``repeats`` runs of n and of 1 token, each from a cold prefill (no prefix reuse)."""
    from recallspec.spec.sampling import SamplingParams

    def gen(k: int) -> Callable[[], Any]:
        p = SamplingParams(max_new_tokens=k, ignore_eos=True)
        return lambda: engine.generate(ids, p, drafter="none", prefix_cache=False)

    t_n = _median_time(gen(n), repeats)
    t_1 = _median_time(gen(1), repeats)
    return _rates(t_n, t_1, n)


def _rates(t_n: float, t_1: float, n: int) -> dict[str, float]:
    dec = max(t_n - t_1, 1e-9)
    return {"e2e_s": t_n, "prefill_s": t_1, "e2e_tok_s": n / t_n,
            "decode_tok_s": (n - 1) / dec, "decode_ms_per_tok": 1000 * dec / (n - 1)}


def _our_cost_curve(engine: Any, cfg: RuntimeConfig) -> dict[str, float]:
    from recallspec.runtime.cost_calibration import forward_times

    t = forward_times(engine.model, engine.cache, engine.threads, cfg.ks, cached=cfg.cached,
                      repeats=cfg.repeats, warmup=2)
    return {str(k): 1000 * v for k, v in t.items()}


# ---- transformers ----------------------------------------------------------------------


def _hf_ar(hf: Any, ids: list[int], n: int, repeats: int) -> dict[str, float]:
    x = torch.tensor([ids])
    mask = torch.ones_like(x)

    def gen(k: int) -> Callable[[], Any]:
        kw = {"max_new_tokens": k, "min_new_tokens": k, "do_sample": False, "eos_token_id": None,
              "pad_token_id": 0, "temperature": None, "top_p": None, "top_k": None}
        return lambda: hf.generate(x, attention_mask=mask, **kw)

    with torch.inference_mode():
        t_n = _median_time(gen(n), repeats)
        t_1 = _median_time(gen(1), repeats)
    return _rates(t_n, t_1, n)


def _hf_cost(hf: Any, cfg: RuntimeConfig, vocab: int, ks: tuple[int, ...]) -> dict[str, float]:
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, vocab, (1, cfg.cached + max(ks)), generator=g)
    out = {}
    with torch.inference_mode():
        cache = DynamicCache(config=hf.config)
        hf(input_ids=ctx[:, : cfg.cached], past_key_values=cache, use_cache=True)
        for k in ks:
            x = ctx[:, cfg.cached : cfg.cached + k]
            pos = torch.arange(cfg.cached, cfg.cached + k)[None]

            def step(x: torch.Tensor = x, pos: torch.Tensor = pos) -> None:
                hf(input_ids=x, past_key_values=cache, position_ids=pos, use_cache=True)
                cache.crop(-int(x.shape[1]))  # transformers 5: negative = tokens to drop

            out[str(k)] = 1000 * _median_time(step, cfg.repeats, 2)
    return out


# ---- the whole benchmark ----------------------------------------------------------


def run_runtime_bench(
    cfg: RuntimeConfig, out: Path | None = None, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    from recallspec.bench.report import _machine, busy_warning
    from recallspec.engine import Engine

    say = log or (lambda m: print(m, flush=True, file=sys.stderr))
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    res: dict[str, Any] = {"config": asdict(cfg), "machine": _machine(),
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    warn = busy_warning(res["machine"])
    if warn:
        say(warn)
    say(f"streaming bandwidth over {cfg.stream_mib} MiB")
    res["stream"] = stream_bandwidth(cfg.stream_mib, cfg.repeats)
    res["dtypes"] = {}
    for dt in cfg.dtypes:
        say(f"[{dt}] loading our model")
        # The KV cache must hold the 512 cached tokens plus the longest chain.
        engine = Engine.load(cfg.model, dtype=dt, max_len=max(1024, cfg.cached + max(cfg.ks) + 8))
        engine.wait_for_repack_cache()  # a first load's cache write: before any timing
        ids = prompt_ids(engine.tokenizer)
        mc = engine.model.config
        r: dict[str, Any] = {"prompt_tokens": len(ids), "new_tokens": cfg.new_tokens}
        say(f"[{dt}] our AR decoding")
        r["ours"] = engine_ar(engine, ids, cfg.new_tokens, cfg.repeats)
        say(f"[{dt}] our verification cost curve")
        curve = _our_cost_curve(engine, cfg)
        r["cost_ms"] = curve
        r["cost_ratio"] = {k: v / curve["1"] for k, v in curve.items()} if "1" in curve else {}
        if getattr(engine.model, "quantized", False):
            wb = quantized_bytes_per_token(engine.model)
        else:
            wb = weight_bytes_per_token(engine.model, int(mc.vocab_size), int(mc.hidden_size))
        r["weight_bytes"] = wb
        r["resident_weight_mb"] = engine.model.weight_bytes() / 1e6
        sec = r["ours"]["decode_ms_per_tok"] / 1000
        r["achieved_gb_s"] = wb["total"] / sec / 1e9
        r["bandwidth_fraction"] = r["achieved_gb_s"] / res["stream"]["read_gb_s"]
        if cfg.hf and dt == "float32":
            from recallspec.bench.hf import hf_model_from_engine

            say(f"[{dt}] transformers generate on the same weights")
            hf = hf_model_from_engine(engine)
            r["hf"] = _hf_ar(hf, ids, cfg.new_tokens, cfg.repeats)
            r["speedup_vs_hf_decode"] = r["ours"]["decode_tok_s"] / r["hf"]["decode_tok_s"]
            r["speedup_vs_hf_e2e"] = r["ours"]["e2e_tok_s"] / r["hf"]["e2e_tok_s"]
            ks = tuple(k for k in (1, 16) if k in cfg.ks) or (1,)
            hc = _hf_cost(hf, cfg, int(mc.vocab_size), ks)
            r["hf_cost_ms"] = hc
            del hf
        res["dtypes"][dt] = r
        threads = engine.threads
        del engine
    if cfg.llamacpp:
        from recallspec.bench.hf import gguf_path_for
        from recallspec.bench.runtime_llamacpp import llamacpp_runtime

        lc = llamacpp_runtime(
            gguf_path_for(cfg.model), ids, new_tokens=cfg.new_tokens, repeats=cfg.repeats,
            ks=cfg.ks, cached=cfg.cached, threads=threads, say=say,
        )
        if lc is not None:
            res["llamacpp"] = lc
            base: dict[str, float] = lc.get("greedy") or {}
            tg = lc.get("bench", {}).get("tg", {}).get("avg_ts")
            for r in res["dtypes"].values():
                if base:
                    r["speedup_vs_llamacpp_decode"] = (r["ours"]["decode_tok_s"]
                                                       / base["decode_tok_s"])
                    r["speedup_vs_llamacpp_e2e"] = r["ours"]["e2e_tok_s"] / base["e2e_tok_s"]
                if tg:
                    r["speedup_vs_llamacpp_tg"] = r["ours"]["decode_tok_s"] / tg
    res["machine_after"] = _machine()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "runtime.json").write_text(json.dumps(res, indent=2), encoding="utf-8")
        (out / "runtime.md").write_text(render_runtime_markdown(res), encoding="utf-8")
        _plot(res, out / "runtime_cost_curve.png")
    return res


def render_runtime_markdown(res: dict[str, Any]) -> str:
    s = res["stream"]
    after = res.get("machine_after", {})
    lines = [
        f"Machine: {res['machine']['cpu']}, {res['machine']['torch_threads']} torch threads, "
        f"torch {res['machine']['torch']}; {res['machine'].get('kernels', '')}; "
        f"{res['date']}; 1-min load "
        f"{res['machine'].get('loadavg_1m')} before, {after.get('loadavg_1m')} after.",
        f"Streaming bandwidth ({s['buffer_mib']:.0f} MiB buffer): read {s['read_gb_s']:.1f} GB/s, "
        f"copy {s['copy_gb_s']:.1f} GB/s.",
        "",
        "| engine | decode tok/s | e2e tok/s | decode vs llama-server | e2e vs llama-server "
        "| resident weight MB | weight MB/token | achieved GB/s | fraction of read BW |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for dt, r in res["dtypes"].items():
        lines.append(
            f"| ours {dt} | {r['ours']['decode_tok_s']:.1f} | {r['ours']['e2e_tok_s']:.1f} "
            f"| {_x(r.get('speedup_vs_llamacpp_decode'))} "
            f"| {_x(r.get('speedup_vs_llamacpp_e2e'))} "
            f"| {r.get('resident_weight_mb', 0):.0f} "
            f"| {r['weight_bytes']['total'] / 1e6:.0f} | {r['achieved_gb_s']:.1f} "
            f"| {100 * r['bandwidth_fraction']:.0f}% |"
        )
        hf = r.get("hf")
        if hf:
            lines.append(f"| transformers {dt} | {hf['decode_tok_s']:.1f} "
                         f"| {hf['e2e_tok_s']:.1f} | | | | | | |")
    if "llamacpp" in res:
        from recallspec.bench.runtime_llamacpp import describe, markdown_rows

        lines += [*markdown_rows(res["llamacpp"]), "", describe(res["llamacpp"])]
    lines += ["", f"Verification cost: one forward of k new tokens on {res['config']['cached']} "
              "cached (ms; ratio to k=1)", ""]
    dts = list(res["dtypes"])
    lc_cost = res.get("llamacpp", {}).get("cost_ms", {})
    lines.append("| k | " + " | ".join(f"ours {d}" for d in dts)
                 + " | " + " | ".join(f"HF {d}" for d in dts) + " | llama.cpp (llama-bench) |")
    lines.append("|---|" + "---|" * (2 * len(dts) + 1))
    for k in [str(k) for k in res["config"]["ks"]]:
        cells = []
        for d in dts:
            r = res["dtypes"][d]
            cells.append(f"{r['cost_ms'][k]:.2f} ({r['cost_ratio'][k]:.2f}x)")
        for d in dts:
            hc = res["dtypes"][d].get("hf_cost_ms", {})
            cells.append(f"{hc[k]:.2f} ({hc[k] / hc['1']:.2f}x)" if k in hc and "1" in hc else "-")
        cells.append(f"{lc_cost[k]:.2f} ({lc_cost[k] / lc_cost['1']:.2f}x)"
                     if k in lc_cost and "1" in lc_cost else "-")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _f(d: dict[str, float] | None, key: str) -> str:
    return "-" if d is None else f"{d[key]:.1f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _plot(res: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for dt, r in res["dtypes"].items():
        ks = [int(k) for k in r["cost_ratio"]]
        ax.plot(ks, list(r["cost_ratio"].values()), marker="o", label=f"ours {dt}")
    lc = res.get("llamacpp", {}).get("cost_ms", {})
    if "1" in lc:
        ax.plot([int(k) for k in lc], [v / lc["1"] for v in lc.values()], marker="s",
                label="llama.cpp")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"k new tokens (on {res['config']['cached']} cached)")
    ax.set_ylabel("forward time / time at k=1")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
