"""Run vLLM once on Spec-Bench prompts, with or without speculation; write one JSON.

    .venv-vllm/bin/python tools/vllm_run.py --model build/smollm2-hf --method recallspec \\
        --prompts 18 --max-new-tokens 128 --k 8 --out /tmp/recallspec.json

Methods: ``none`` (plain decoding), ``recallspec`` (``custom_class`` with
``recallspec.integrations.vllm.SuffixProposer``), ``ngram`` (vLLM's prompt lookup,
``prompt_lookup_min/max`` 1..5 here). Greedy, fp32, eager mode (the CPU build). The
prompts are Spec-Bench first turns, stratified over the categories (the first question
of each category, then the second, ...), in the model's chat template. Reported: each
prompt's output token ids, the decode wall time of all prompts submitted together
(after a warm-up request), tokens/s, and vLLM's own speculative decoding counters.

One configuration per process: vLLM starts an engine process per ``LLM`` (hence the
``__main__`` guard) and frees it only at exit; the test
(tests/integrations/test_integration_vllm.py, ``make test-vllm``) runs this script once
per method. Its figures: the notebook docs/history/benchmarks_2026-11.md, "Integrations:
transformers `custom_generate` and vLLM (issue 20, 2026-11-23)".
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any


def spec_bench_prompts(n: int, data_dir: Path) -> list[str]:
    qs = [json.loads(line) for line in
          (data_dir / "spec_bench" / "question.jsonl").read_text().splitlines() if line.strip()]
    by_cat: dict[str, list[str]] = {}
    for q in qs:
        by_cat.setdefault(str(q["category"]), []).append(str(q["turns"][0]))
    out: list[str] = []
    i = 0
    while len(out) < n and i < max(len(v) for v in by_cat.values()):
        for cat in sorted(by_cat):
            if i < len(by_cat[cat]) and len(out) < n:
                out.append(by_cat[cat][i])
        i += 1
    return out


def speculative_config(method: str, k: int) -> dict[str, Any] | None:
    if method == "none":
        return None
    if method == "recallspec":
        return {"method": "custom_class", "num_speculative_tokens": k,
                "model": "recallspec.integrations.vllm.SuffixProposer"}
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k,
                "prompt_lookup_min": 1, "prompt_lookup_max": 5}
    raise SystemExit(f"unknown method {method!r}")


def counters(llm: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode") and hasattr(m, "value"):
            out[m.name.removeprefix("vllm:")] = out.get(m.name, 0) + int(m.value)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--method", default="none", choices=["none", "recallspec", "ngram"])
    ap.add_argument("--prompts", type=int, default=18)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    ap.add_argument("--max-num-seqs", type=int, default=None,
                    help="concurrent requests (default vLLM's; 1 = one request at a time)")
    ap.add_argument("--data-dir", default=os.environ.get("RECALLSPEC_DATA_DIR", "../shared/data"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    tok = AutoTokenizer.from_pretrained(args.model)
    texts = spec_bench_prompts(args.prompts, Path(args.data_dir))
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": t}],
                                            add_generation_prompt=True, tokenize=True,
                                            return_dict=False)) for t in texts]
    extra: dict[str, Any] = {}
    if args.max_num_seqs:
        extra["max_num_seqs"] = args.max_num_seqs
    t0 = time.perf_counter()
    llm = LLM(model=args.model, dtype="float32", enforce_eager=True, max_model_len=2048,
              seed=0, disable_log_stats=False, kv_cache_memory_bytes=2 << 30,
              speculative_config=speculative_config(args.method, args.k), **extra)
    start_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens)
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0])],
                 SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    before = counters(llm)
    t1 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                        use_tqdm=False)
    secs = time.perf_counter() - t1
    after = counters(llm)
    ids = [list(o.outputs[0].token_ids) for o in outs]
    n_new = sum(len(x) for x in ids)
    spec = {k: v - before.get(k, 0) for k, v in after.items()}
    result = {
        "method": args.method, "k": args.k, "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens, "max_num_seqs": args.max_num_seqs,
        "start_s": round(start_s, 2), "decode_s": round(secs, 3), "new_tokens": n_new,
        "tokens_per_s": round(n_new / secs, 2), "spec_decode": spec, "token_ids": ids,
        "prompt_tokens": [len(p) for p in prompts],
    }
    Path(args.out).write_text(json.dumps(result))
    print(json.dumps({k: v for k, v in result.items() if k != "token_ids"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
