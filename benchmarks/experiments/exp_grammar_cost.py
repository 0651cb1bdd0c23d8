"""What a grammar costs a constrained step, and what its forced drafts give: engine
requests under a JSON schema (the extraction schema of the agent workloads) and under
free text, at batch 1 and 8, plain decoding and the default policy, one process.

Per case: tokens/s of the decode phase, tokens per step, the grammar's seconds per
masked row (cuts, forced tokens and masks: ``StepStats.grammar_s`` / ``grammar_rows``)
as a fraction of the mean decode step, and the forced tokens' share of the accepted
draft tokens. Greedy; every constrained output is checked against the AR one (lossless)
and parsed as JSON.

    .venv/bin/python benchmarks/experiments/exp_grammar_cost.py \
        --out docs/results/agents/grammar_cost
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from _common import utc_now, write_outputs

from recallspec.bench.common.machine import machine_info
from recallspec.decoding.masks import Guide
from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import Engine

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "born", "city", "field", "summary"],
          "properties": {"name": {"type": "string"}, "born": {"type": "integer"},
                         "city": {"type": "string"}, "field": {"type": "string"},
                         "summary": {"type": "string"}}}
PEOPLE = [("Ada Lovelace", "London", 1815, "mathematics"), ("Alan Turing", "London", 1912,
          "computer science"), ("Grace Hopper", "New York", 1906, "computing"),
          ("Marie Curie", "Warsaw", 1867, "physics"), ("Nikola Tesla", "Smiljan", 1856,
          "engineering"), ("Emmy Noether", "Erlangen", 1882, "algebra"),
          ("Carl Gauss", "Brunswick", 1777, "mathematics"), ("Rosalind Franklin", "London",
          1920, "chemistry")]


def prompt(p: tuple[str, str, int, str]) -> str:
    name, city, born, field = p
    return (f"{name} was born in {city} in {born} and worked in {field}. Give name, born, "
            "city, field and a one-sentence summary as a JSON object.")


def run(engine: Engine, ids: list[list[int]], params: SamplingParams, drafter: str,
        batch: int) -> dict[str, Any]:
    engine.generate(ids[0], params, drafter=drafter)  # warm: the drafter, the grammar
    t0 = time.perf_counter()
    out = []
    stats = []
    for lo in range(0, len(ids), batch):
        got = engine.generate(ids[lo:lo + batch], [params] * len(ids[lo:lo + batch]),
                              drafter=drafter)
        out += got
        stats.append(engine.stats)
    wall = time.perf_counter() - t0
    steps = sum(s.steps for s in stats)
    decode_s = sum(s.decode_only_s for s in stats)
    grammar_s = sum(s.grammar_s for s in stats)
    rows = sum(s.grammar_rows for s in stats)
    accepted = sum(sum(r.accept_lengths) - r.steps for r in out)
    forced = sum(s.forced_tokens for s in stats)
    step_s = decode_s / max(steps, 1)
    return {"drafter": drafter, "batch": batch, "tokens": sum(r.new_tokens for r in out),
            "wall_s": wall, "tok_per_s": sum(r.new_tokens for r in out) / wall,
            "decode_tok_per_s": sum(s.decode_only_tokens for s in stats) / max(decode_s, 1e-9),
            "tokens_per_step": sum(sum(r.accept_lengths) for r in out) / max(steps, 1),
            "step_ms": 1e3 * step_s, "grammar_us_per_row": 1e6 * grammar_s / max(rows, 1),
            "grammar_rows_per_step": rows / max(steps, 1),
            "grammar_share_of_step": grammar_s / max(decode_s, 1e-9),
            "grammar_row_share_of_step": grammar_s / max(rows, 1) / max(step_s, 1e-9),
            "accepted_draft_tokens": accepted, "forced_accepted": forced,
            "forced_share": forced / accepted if accepted else 0.0,
            "cut": sum(s.cut_tokens for s in stats),
            "outputs": [r.token_ids for r in out], "texts": [r.text for r in out]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--drafter", default="portfolio",
                    help="the policy measured (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    engine = Engine.load(None, max_batch_size=8)
    ids = [engine.encode_prompt(prompt(p), chat=True) for p in PEOPLE]
    rows = []
    for mode, guide in (("json_schema", Guide.json_schema(SCHEMA)), ("free", None)):
        params = SamplingParams(max_new_tokens=args.max_tokens, guide=guide)
        for batch in (1, 8):
            ar = run(engine, ids, params, "none", batch)
            sp = run(engine, ids, params, args.drafter, batch)
            assert sp["outputs"] == ar["outputs"], "constrained speculation changed the output"
            valid = sum(_is_json(t) for t in sp["texts"]) if guide else None
            for r in (ar, sp):
                rows.append({"mode": mode, **{k: v for k, v in r.items()
                                             if k not in ("outputs", "texts")},
                             "valid_json": valid,
                             "speedup_vs_ar": r["tok_per_s"] / ar["tok_per_s"]})
    lines = [f"# Grammar cost and forced drafts ({utc_now()})", "",
             f"Machine: {machine_info().get('cpu', '?')}; {len(PEOPLE)} prompts, greedy, "
             f"max {args.max_tokens} tokens; command: `.venv/bin/python "
             "benchmarks/experiments/exp_grammar_cost.py --out ...`", "",
             "| mode | drafter | batch | tok/s | x AR | tokens / step | step ms | grammar µs / row "
             "| rows / step | grammar / step | forced share of accepted | cut | valid JSON |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['drafter']} | {r['batch']} | {r['tok_per_s']:.1f} | "
            f"{r['speedup_vs_ar']:.2f} | {r['tokens_per_step']:.2f} | {r['step_ms']:.2f} | "
            f"{r['grammar_us_per_row']:.1f} | {r['grammar_rows_per_step']:.1f} | "
            f"{100 * r['grammar_share_of_step']:.1f}% | {100 * r['forced_share']:.0f}% | "
            f"{r['cut']} | {'-' if r['valid_json'] is None else r['valid_json']} |")
    write_outputs(args.out, {"date": utc_now(), "machine": machine_info(), "rows": rows}, lines)


def _is_json(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


if __name__ == "__main__":
    main()
