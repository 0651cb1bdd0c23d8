"""transformers integration: our drafters via ``custom_generate`` vs ``generate``.

    .venv/bin/python benchmarks/experiments/exp_integrations.py --prompts 12 --max-new-tokens 128 \\
        --out bench_out/integrations_hf

Methods, run interleaved prompt by prompt on one transformers model holding our loaded
weights (SmolLM2 by default, fp32, sdpa; ``recallspec.bench.common.hf``), batch 1, greedy:

* ``hf-greedy``: ``model.generate(do_sample=False)``
* ``hf-pld``: ``model.generate(prompt_lookup_num_tokens=10)`` (transformers' prompt lookup)
* ``rs-<drafter>``: ``model.generate(custom_generate=recallspec.integrations.hf.generate,
  drafter=...)`` for each ``--drafters`` entry (``name`` or ``name:key=value:...``)

``--random-shape llama-1b|llama-3b|llama-8b`` swaps the model for a Llama of that shape
with seeded random weights (for timing on a GPU; its text is meaningless, so its
acceptance says little about real text: read its ``mat`` column), ``--dtype`` sets the
transformers model's dtype, ``--device cuda`` runs it on a GPU.

Every output is compared with ``hf-greedy``'s (``identical``). Speedups are total new
tokens / total decode seconds relative to ``hf-greedy`` and to ``hf-pld`` of the same run.
Writes ``report.json`` and ``report.md`` in ``--out``. Prompts: Spec-Bench first turns,
stratified over categories, in the model's chat template.

Feeds the notebook docs/history/benchmarks_2026-11.md, "Integrations: transformers
`custom_generate` and vLLM (issue 20, 2026-11-23)" and its "On a GPU" part (vLLM's side:
tools/vllm_run.py, run by `make test-vllm`).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from _common import utc_now, write_outputs

from recallspec.markdown import table_lines


def prompts_from_spec_bench(n: int) -> list[str]:
    from recallspec.data.paths import data_dir

    path = data_dir() / "spec_bench" / "question.jsonl"
    qs = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    by_cat: dict[str, list[str]] = {}
    for q in qs:
        by_cat.setdefault(str(q["category"]), []).append(str(q["turns"][0]))
    out: list[str] = []
    i = 0
    while len(out) < n and i < max(map(len, by_cat.values())):
        for cat in sorted(by_cat):
            if i < len(by_cat[cat]) and len(out) < n:
                out.append(by_cat[cat][i])
        i += 1
    return out


# Llama shapes for timing with random weights (hidden, intermediate, layers, heads, kv heads):
# Llama-3.2-1B, Llama-3.2-3B and Llama-3.1-8B.
RANDOM_SHAPES = {
    "llama-1b": (2048, 8192, 16, 32, 8),
    "llama-3b": (3072, 8192, 28, 24, 8),
    "llama-8b": (4096, 14336, 32, 32, 8),
}


def random_llama(shape: str, vocab_size: int, eos: int, dtype: Any, device: str) -> Any:
    """A transformers Llama of a named shape with seeded random weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, inter, layers, heads, kv = RANDOM_SHAPES[shape]
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=inter,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, max_position_embeddings=4096,
                      eos_token_id=eos, pad_token_id=eos, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    return model.eval()


def run_method(model: Any, ids: Any, method: str, max_new: int) -> tuple[list[int], float]:
    import torch

    import recallspec.integrations.hf as rs_hf
    from recallspec.drafters.spec import DrafterSpec

    kw: dict[str, Any] = {"max_new_tokens": max_new, "do_sample": False}
    if method == "hf-pld":
        kw["prompt_lookup_num_tokens"] = 10
    elif method.startswith("rs-"):
        spec = DrafterSpec.parse(method[3:])  # (transformers' loop has no sizing: fixed)
        kw.update(custom_generate=rs_hf.generate, drafter=spec.name,
                  drafter_options=spec.kwargs)
    if ids.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
    if ids.device.type == "cuda":
        torch.cuda.synchronize()
    return out[0, ids.shape[1]:].tolist(), time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model spec (default SmolLM2-135M-Instruct)")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--drafters", default="pld,llma,sam,sam+recycling",
                    help="comma-separated drafter specs for the rs-* methods")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--random-shape", default=None, choices=sorted(RANDOM_SHAPES),
                    help="a Llama of this shape with random weights instead of --model")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default torch's; 1 avoids OpenMP spin on a busy CPU)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch

    from recallspec.bench.common.hf import hf_model_from_model
    from recallspec.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)

    # fp32 means fp32: no TF32 tensor-core shortcut on a GPU.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = getattr(torch, args.dtype)
    ours, tok = load_model(args.model, dtype=torch.float32)
    if args.random_shape:
        eos = ours.config.eos_token_ids[0]
        model = random_llama(args.random_shape, ours.config.vocab_size, eos, dtype, args.device)
    else:
        model = hf_model_from_model(ours).to(device=args.device, dtype=dtype)
    del ours
    methods = ["hf-greedy", "hf-pld", *(f"rs-{d}" for d in args.drafters.split(",") if d)]
    texts = prompts_from_spec_bench(args.prompts)
    warm = torch.tensor([tok.encode_prompt("Hello")], device=args.device)
    for m in methods:  # first-call costs (allocator, kernels) out of the measurement
        run_method(model, warm, m, 4)
    per: dict[str, dict[str, Any]] = {m: {"tokens": 0, "seconds": 0.0, "identical": 0}
                                      for m in methods}
    for i, text in enumerate(texts):
        chat = tok.apply_chat_template([{"role": "user", "content": text}],
                                       add_generation_prompt=True)
        ids = torch.tensor([tok.encode_prompt(chat)], device=args.device)
        ref: list[int] | None = None
        for m in methods:
            new, secs = run_method(model, ids, m, args.max_new_tokens)
            ref = new if ref is None else ref
            per[m]["tokens"] += len(new)
            per[m]["seconds"] += secs
            per[m]["identical"] += new == ref
        print(f"prompt {i + 1}/{len(texts)} done", flush=True)
    rows = []
    for m in methods:
        tps = per[m]["tokens"] / per[m]["seconds"]
        rows.append({"method": m, "tokens_per_s": round(tps, 2), **per[m]})
    base = {r["method"]: r["tokens_per_s"] for r in rows}
    for r in rows:
        r["speedup_vs_greedy"] = round(r["tokens_per_s"] / base["hf-greedy"], 3)
        r["speedup_vs_pld"] = round(r["tokens_per_s"] / base["hf-pld"], 3)
        r["seconds"] = round(r["seconds"], 3)
    report = {
        "model": (f"random {args.random_shape}" if args.random_shape
                  else args.model or "SmolLM2-135M-Instruct"),
        "dtype": args.dtype, "device": args.device,
        "device_name": (torch.cuda.get_device_name() if args.device.startswith("cuda")
                        else platform.processor() or platform.machine()),
        "threads": torch.get_num_threads(), "prompts": len(texts),
        "max_new_tokens": args.max_new_tokens,
        "machine": platform.processor() or platform.machine(),
        "date": utc_now(), "rows": rows,
    }
    md = table_lines(
        ["method", "tok/s", "vs generate", "vs generate+PLD", "identical to generate"],
        [[r["method"], r["tokens_per_s"], f"{r['speedup_vs_greedy']}x",
          f"{r['speedup_vs_pld']}x", f"{r['identical']}/{len(texts)}"] for r in rows])
    write_outputs(Path(args.out) / "report", report, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
