#!/usr/bin/env python
"""Quality of the quantized path (issue 17): perplexity and greedy agreement.

* Perplexity on held-out text: CNN/DailyMail articles from the shared data (the first
  ``--articles`` articles, each scored alone as ``Article: ...`` up to ``--max-tokens``
  tokens), for our fp32 reference (dequantized GGUF), our quantized path (the GGUF's own
  blocks, 8-bit activations) and llama-cpp-python on the same GGUF (child process, when
  it is installed: ``make peers-py``; perplexity needs every position's logits, which
  native llama-server does not return).
* Greedy agreement with the fp32 path on Spec-Bench prompts (``--per-category`` per
  category, first turns, chat template, ``--new-tokens``): tokens until the first
  divergence (median, and the fraction of answers identical) for our quantized path and
  for native llama.cpp greedy (``llama-server``, when ``make peers`` built it).

  .venv/bin/python benchmarks/experiments/exp_quant_quality.py --out bench_out/quality

Writes quality.json and quality.md to --out.

Feeds the notebook docs/history/benchmarks_2026-11.md, "Quality of the quantized path
(issue 17)"; `make peers-py` exists for its llama-cpp-python perplexity
(docs/DEVELOPMENT.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from _common import utc_now, write_outputs

from recallspec.bench.common import llamacpp
from recallspec.bench.common.hf import gguf_path_for
from recallspec.bench.common.machine import machine_info
from recallspec.bench.common.prompting import conversation_ids
from recallspec.bench.common.suites import SuiteSelection, load_suite
from recallspec.bench.peers.methods import ChildMethod, peer_command
from recallspec.data.paths import data_dir
from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import Engine
from recallspec.markdown import table_lines
from recallspec.runtime.batch import SequenceInput, build_batch


def articles(n: int) -> list[str]:
    path = data_dir() / "cnn_dailymail" / "cad_cnndm_1_0.jsonl"
    out: list[str] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["context_string"]
            text = text.split("\n")[0]  # "Article: ..." (the file also holds a summary prompt)
            if text not in seen:  # each article is in the file twice
                seen.add(text)
                out.append(text)
            if len(out) == n:
                break
    return out


def nll_ours(engine: Any, ids: list[int]) -> tuple[float, int]:
    model = engine.model
    cache = model.new_cache(1, len(ids) + 1)
    with torch.inference_mode():
        logits = model(build_batch([SequenceInput(0, 0, ids[:-1])]), cache).double()
    logp = torch.log_softmax(logits, dim=-1)
    tgt = torch.tensor(ids[1:])
    return float(-logp[torch.arange(len(tgt)), tgt].sum()), len(tgt)


def first_divergence(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def llamacpp_py_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--articles", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    res: dict[str, Any] = {"machine": machine_info(), "args": vars(args), "date": utc_now()}
    engines = {fmt: Engine.load(args.model, dtype=fmt) for fmt in ("float32", "quantized")}
    tok = engines["float32"].tokenizer
    docs = [tok.encode_prompt(t)[: args.max_tokens] for t in articles(args.articles)]
    lc = None
    threads = engines["float32"].threads
    if llamacpp_py_available():
        gguf = gguf_path_for(args.model)
        lc = ChildMethod("llamacpp-py-pld", peer_command("llamacpp-py-pld", gguf, threads),
                         tok, "llamacpp-py-greedy")
    ppl: dict[str, float] = {}
    for name in ("float32", "quantized", "llama-cpp-python"):
        if name == "llama-cpp-python" and lc is None:
            continue
        total, count = 0.0, 0
        for ids in docs:
            if name == "llama-cpp-python":
                assert lc is not None
                r = lc.request({"op": "nll", "tokens": ids})
                nll, n = float(r["nll"]), int(r["count"])
            else:
                nll, n = nll_ours(engines[name], ids)
            total += nll
            count += n
        ppl[name] = math.exp(total / count)
        say(f"perplexity {name}: {ppl[name]:.3f} over {count} tokens")
    res["perplexity"] = {"values": ppl, "tokens": sum(len(d) - 1 for d in docs),
                         "articles": len(docs)}
    if lc is not None:
        lc.close()

    qs = load_suite("spec_bench", SuiteSelection(per_category=args.per_category))
    prompts = [conversation_ids(tok, q.turns[:1], []) for q in qs]
    params = SamplingParams(max_new_tokens=args.new_tokens)
    ref = [engines["float32"].generate(p, params).token_ids for p in prompts]
    agree: dict[str, Any] = {}
    others: dict[str, list[list[int]]] = {
        "quantized": [engines["quantized"].generate(p, params).token_ids for p in prompts]}
    if llamacpp.available():
        eos = set(tok.eos_token_ids)
        cfg = llamacpp.ServerConfig(gguf_path_for(args.model), threads)
        with llamacpp.LlamaServer(cfg) as server:
            outs = [server.complete(p, args.new_tokens).token_ids for p in prompts]
        # Cut at our first EOS, as our engine stops there (EOS excluded).
        others["llama.cpp (llama-server)"] = [
            o[: next((i for i, t in enumerate(o) if t in eos), len(o))] for o in outs]
    for name, outs in others.items():
        div = [first_divergence(a, b) for a, b in zip(ref, outs, strict=True)]
        same = sum(a == b for a, b in zip(ref, outs, strict=True))
        agree[name] = {"median_tokens_to_divergence": statistics.median(div),
                       "identical": same / len(ref), "prompts": len(ref),
                       "per_prompt": div}
        say(f"greedy vs fp32, {name}: median {statistics.median(div)} tokens to the first "
            f"divergence, {same}/{len(ref)} identical")
    res["greedy_agreement"] = agree
    lines = [
        f"{res['machine']['cpu']}, {res['machine']['kernels']}; {res['date']}", "",
        f"Perplexity on {len(docs)} CNN/DailyMail articles "
        f"({res['perplexity']['tokens']} scored tokens):", "",
        *table_lines(["weights / engine", "perplexity"],
                     [[k, f"{v:.3f}"] for k, v in ppl.items()]), "",
        f"Greedy agreement with our fp32 path, Spec-Bench {len(prompts)} first turns, "
        f"{args.new_tokens} new tokens:", "",
        *table_lines(["engine", "median tokens to first divergence", "identical answers"],
                     [[k, v["median_tokens_to_divergence"], f"{100 * v['identical']:.0f}%"]
                      for k, v in agree.items()]),
    ]
    write_outputs(out / "quality", res, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
