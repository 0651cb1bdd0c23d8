"""The conformance table: every variant and format, measured against its outside truth,
written as ``conformance.json`` and ``conformance.md`` (``recallspec conformance``).

Rows per variant: ``F32`` (our fp32 path on the converter's f32 GGUF against
transformers on the original checkpoint: the largest relative logit difference over the
600-token sequence and whether 64 greedy tokens are identical) and one per quantized
format (our quantized path against native llama.cpp on the same file: top-1 agreement
and mean KL over the 600 positions), each with the bound the tests hold it to.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recallspec.bench.common.machine import machine_info
from recallspec.conformance import checks
from recallspec.conformance.checkpoints import LLAMA_CPP_COMMIT, QUANTS, build, quantized
from recallspec.conformance.variants import SEQ_LEN, Variant
from recallspec.markdown import table_lines


def measure(variants: Sequence[Variant], quants: Sequence[str] = QUANTS,
            llamacpp: bool = True) -> list[dict[str, Any]]:
    """One row per (variant, format); progress on stderr."""
    rows: list[dict[str, Any]] = []
    for v in variants:
        t0 = time.perf_counter()
        b = build(v)
        hf = checks.hf_model(b)
        ids = checks.token_ids(int(hf.config.vocab_size))
        ref = checks.hf_logits(hf, ids)
        model = checks.load_ours(b.f32_gguf, "float32")
        a = checks.agreement(ref, checks.ours_logits(model, ids, v.context))
        prompt = ids[: SEQ_LEN - checks.GREEDY_TOKENS]
        same = checks.ours_greedy(model, prompt, v.context) == checks.hf_greedy(hf, prompt)
        rows.append({"variant": v.name, "follows": v.follows, "model_type": v.model_type,
                     "format": "F32", "truth": "transformers", **a.to_dict(),
                     "greedy_identical": same, "passes": a.max_rel <= checks.FP32_REL and same})
        for q in (*quants, *v.extra_quants) if llamacpp else ():
            gguf = quantized(b, q)
            # (RoPE as llama.cpp computes it where the two differ: this row is of the
            # file's blocks; checks.with_llamacpp_rope.)
            quant_model = checks.with_llamacpp_rope(checks.load_ours(gguf, "auto"))
            ours = checks.ours_logits(quant_model, ids, v.context)
            theirs = checks.llamacpp_logits(gguf, ids, v.context)
            aq = checks.agreement(theirs, ours)
            extra: dict[str, Any] = {}
            if quant_model.config.moe:  # (checks.MOE_TRUTH_RATIO: why)
                extra = {"ours_to_truth": checks.agreement(ref, ours).mean_kl,
                         "llamacpp_to_truth": checks.agreement(ref, theirs).mean_kl}
            rows.append({"variant": v.name, "follows": v.follows, "model_type": v.model_type,
                         "format": q, "truth": "llama.cpp", **aq.to_dict(), **extra,
                         "passes": checks.quant_passes(q, aq, moe=bool(extra), **extra)})
        print(f"recallspec conformance: {v.name} measured ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    return rows


def _machine() -> dict[str, Any]:
    """The benchmarks' machine record, plus the two outside truths' versions."""
    import transformers  # (heavy: imported when a report is written, not by the CLI)

    return {**machine_info(), "transformers": transformers.__version__,
            "llama.cpp": LLAMA_CPP_COMMIT}


def render_markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        "# Conformance: the models people run, against an outside truth",
        "",
        f"Measured {doc['date']} on {m['kernels']}; transformers "
        f"{m['transformers']}, torch {m['torch']}, llama.cpp {m['llama.cpp']}. Command: "
        f"`{doc['command']}`.",
        "",
        "Each variant is a tiny random checkpoint with the named published configs' features"
        " (`src/recallspec/conformance/variants.py`), converted by llama.cpp's own "
        "`convert_hf_to_gguf.py` and quantized by `llama-quantize`. **F32**: our fp32 path "
        "on that GGUF against transformers on the original checkpoint, "
        f"{SEQ_LEN} positions past every original context and window (bound: max relative "
        f"difference <= {checks.FP32_REL:.1e}) and 64 greedy tokens. **Q8_0 / Q4_0 / "
        "Q4_K_M**: our quantized path against native llama.cpp on the same file (bounds: "
        + "; ".join(f"{q} top-1 >= {b.top1}, mean KL <= {b.mean_kl:g}"
                    for q, b in checks.LLAMACPP_BOUNDS.items())
        + "). Where llama.cpp computes RoPE otherwise than the model's config says "
        "(gpt-oss's YaRN correction range, which llama.cpp rounds), our side of a "
        "quantized row computes it llama.cpp's way (`checks.with_llamacpp_rope`): those "
        "rows are of the file's blocks, the F32 row of the maths. A mixture of experts "
        "(Qwen3-MoE, gpt-oss): its few positions where the engines' "
        "noise flips a row's choice of experts dominate the mean KL, so its rows are held "
        "instead to the median KL within that bound and to a mean KL from transformers' "
        f"fp32 logits at most {checks.MOE_TRUTH_RATIO}x llama.cpp's own (both in the "
        "note column; `checks.MOE_TRUTH_RATIO`: why). The tests (`tests/conformance/`) "
        "hold every row to its bound.",
        "",
    ]
    body = []
    for r in doc["rows"]:
        fp32 = r["format"] == "F32"
        greedy = ("identical" if r["greedy_identical"] else "differ") if fp32 else ""
        note = ""
        if "ours_to_truth" in r:
            note = (f"median KL {r['median_kl']:.1e}; from transformers: ours "
                    f"{r['ours_to_truth']:.2e}, llama.cpp {r['llamacpp_to_truth']:.2e}")
        body.append((r["variant"], r["follows"] if fp32 else "", r["format"], r["truth"],
                     f"{r['max_rel']:.1e}", greedy, f"{r['top1']:.3f}", f"{r['mean_kl']:.1e}",
                     "yes" if r["passes"] else "**no**", note))
    lines += table_lines(("variant", "follows", "format", "truth", "max rel. diff",
                          "greedy 64", "top-1", "mean KL", "within bound", "note"), body)
    return "\n".join(lines) + "\n"


def write(rows: list[dict[str, Any]], out: Path, command: str) -> dict[str, Any]:
    doc = {"date": dt.date.today().isoformat(), "command": command, "machine": _machine(),
           "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "conformance.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "conformance.md").write_text(render_markdown(doc))
    return doc
