"""`recallspec bench runtime`: how fast our forward is, measured in one run.

Three measurements, each the median of ``repeats`` timings after a warm-up:

1. AR decoding tokens/s: our engine (drafter none, greedy, EOS ignored so every run
   emits exactly ``new_tokens``) for each weight format (quantized: the GGUF's own
   blocks; float32: the reference), vs transformers ``generate`` on the fp32 weights
   and vs native llama.cpp on the same GGUF (``llama-server`` greedy timed by the
   server, and ``llama-bench`` tg / pp; ``bench/runtime/llamacpp.py``), same prompt ids
   and threads. Reported end-to-end (prefill included) and decode-only (time(N) -
   time(1) for the N - 1 tokens after the first).
2. Verification cost curve: one forward of a chain of k new tokens (all rows with
   logits, as the engine's verification) on top of 512 cached tokens, as ms and as
   a ratio to k = 1; transformers' forward at k = 1 and 16 with a 512-token cache and
   llama-server's curve (``bench/runtime/llamacpp.py``) for reference.
3. Achieved memory bandwidth: weight bytes one decode step reads / decode time per
   token (``bench/common/decode.py``), vs a streaming read bandwidth measured in the
   same run on a buffer far larger than the caches (``bench/common/machine.py``).
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

from recallspec.bench.common.decode import (
    ar_rates,
    engine_ar,
    prompt_ids,
    quantized_bytes_per_token,
    weight_bytes_per_token,
)
from recallspec.bench.common.hf import gguf_path_for, hf_model_from_engine
from recallspec.bench.common.machine import busy_warning, machine_info, stream_bandwidth
from recallspec.bench.common.report import num, pyplot
from recallspec.bench.runtime.llamacpp import describe, llamacpp_runtime, table_rows
from recallspec.cost.calibration import forward_times, median_time
from recallspec.engine import Engine
from recallspec.errors import DataError
from recallspec.markdown import table_lines

KS = (1, 2, 4, 8, 16, 32, 64, 128)
CACHED = 512


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


# ---- our model ----------------------------------------------------------------------


def _our_cost_curve(engine: Any, cfg: RuntimeConfig) -> dict[str, float]:
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
        t_n = median_time(gen(n), repeats)
        t_1 = median_time(gen(1), repeats)
    return ar_rates(t_n, t_1, n)


def _hf_cost(hf: Any, cfg: RuntimeConfig, vocab: int, ks: tuple[int, ...]) -> dict[str, float]:
    # Here, not at the top: transformers takes seconds to import, and only the HF
    # comparison (hf=True) needs it.
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

            out[str(k)] = 1000 * median_time(step, cfg.repeats, 2)
    return out


# ---- the whole benchmark ----------------------------------------------------------


def run_runtime_bench(
    cfg: RuntimeConfig, out: Path | None = None, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    say = log or (lambda m: print(m, flush=True, file=sys.stderr))
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    res: dict[str, Any] = {"config": asdict(cfg), "machine": machine_info(),
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
    res["machine_after"] = machine_info()
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
        f"Streaming bandwidth ({s['buffer_mib']:.0f} MiB buffer): read {s['read_gb_s']:.1f} GB/s "
        f"(prefetching; torch's sum {s['sum_gb_s']:.1f}), copy {s['copy_gb_s']:.1f} GB/s.",
        "",
    ]
    rows: list[list[str]] = []
    for dt, r in res["dtypes"].items():
        rows.append([
            f"ours {dt}", f"{r['ours']['decode_tok_s']:.1f}", f"{r['ours']['e2e_tok_s']:.1f}",
            num(r.get("speedup_vs_llamacpp_decode"), ".2f", "x"),
            num(r.get("speedup_vs_llamacpp_e2e"), ".2f", "x"),
            f"{r.get('resident_weight_mb', 0):.0f}", f"{r['weight_bytes']['total'] / 1e6:.0f}",
            f"{r['achieved_gb_s']:.1f}", f"{100 * r['bandwidth_fraction']:.0f}%"])
        hf = r.get("hf")
        if hf:
            rows.append([f"transformers {dt}", f"{hf['decode_tok_s']:.1f}",
                         f"{hf['e2e_tok_s']:.1f}", *[""] * 6])
    if "llamacpp" in res:
        rows += table_rows(res["llamacpp"])
    lines += table_lines(["engine", "decode tok/s", "e2e tok/s", "decode vs llama-server",
                          "e2e vs llama-server", "resident weight MB", "weight MB/token",
                          "achieved GB/s", "fraction of read BW"], rows)
    if "llamacpp" in res:
        lines += ["", describe(res["llamacpp"])]
    lines += ["", f"Verification cost: one forward of k new tokens on {res['config']['cached']} "
              "cached (ms; ratio to k=1)", ""]
    dts = list(res["dtypes"])
    lc_cost = res.get("llamacpp", {}).get("cost_ms", {})
    costs: list[list[str]] = []
    for k in [str(k) for k in res["config"]["ks"]]:
        cells = [k]
        for d in dts:
            r = res["dtypes"][d]
            cells.append(f"{r['cost_ms'][k]:.2f} ({r['cost_ratio'][k]:.2f}x)")
        for cost in [res["dtypes"][d].get("hf_cost_ms", {}) for d in dts] + [lc_cost]:
            cells.append(f"{cost[k]:.2f} ({cost[k] / cost['1']:.2f}x)"
                         if k in cost and "1" in cost else "-")
        costs.append(cells)
    lines += table_lines(["k", *(f"ours {d}" for d in dts), *(f"HF {d}" for d in dts),
                          "llama.cpp (llama-bench)"], costs)
    return "\n".join(lines) + "\n"


def _plot(res: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    if plt is None:
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
