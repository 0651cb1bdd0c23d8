"""Time to first token of later turns with the prefix cache on and off (issue 38), one
request at a time on one engine per setting, interleaved per conversation.

    .venv/bin/python scripts/exp_prefix_ttft.py [--conversations 16] [--max-new-tokens 64]
        [--out bench_out/prefix/ttft]

Workloads: MT-Bench's two-turn questions (turn 2 = turn 1, its answer and the second
question) and an agent-style loop built from the same questions (each of 4 steps re-sends
the whole transcript plus a tool result). TTFT here is the engine's ``prefill_time``
(admission to the first token; no queueing: one request at a time). Every answer is
checked equal with the cache on and off. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from recallspec import Engine, SamplingParams
from recallspec.bench.suites import SuiteSelection, load_suite
from recallspec.engine import EngineConfig

AGENT_STEPS = 4


def conversations(eng: Engine, n: int) -> list[tuple[str, list[str]]]:
    qs = load_suite("mt_bench", SuiteSelection())[:n]
    return [(q.category, list(q.turns)) for q in qs]


def run_chat(eng: Engine, turns: list[str], params: SamplingParams,
             agent: bool) -> list[tuple[float, int, list[int]]]:
    """(TTFT, cached tokens, answer) per turn (agent: per step)."""
    msgs: list[dict[str, str]] = []
    out = []
    steps = turns if not agent else [turns[0], *(f"Tool result {i}: ok."
                                                  for i in range(1, AGENT_STEPS))]
    for user in steps:
        msgs.append({"role": "user", "content": user})
        r = eng.generate(eng.prompt_ids(msgs), params)
        out.append((r.prefill_time, r.cached_tokens, r.token_ids))
        msgs.append({"role": "assistant", "content": r.text})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default="bench_out/prefix/ttft")
    a = ap.parse_args()
    base = Engine.load(drafter="none", prefix_cache=False)
    engines = {"off": base, "on": Engine(base.model, base.tokenizer,
                                         EngineConfig(drafter="none", prefix_cache=True))}
    params = SamplingParams(max_new_tokens=a.max_new_tokens)
    convs = conversations(base, a.conversations)
    res: dict[str, Any] = {}
    for workload, agent in (("mt_bench_2turn", False), ("agent_loop", True)):
        later: dict[str, list[float]] = {"on": [], "off": []}
        first: dict[str, list[float]] = {"on": [], "off": []}
        cached, same, n = [], 0, 0
        for i, (_, turns) in enumerate(convs):
            got = {}
            for s in (("off", "on") if i % 2 == 0 else ("on", "off")):
                got[s] = run_chat(engines[s], turns, params, agent)
            for s in ("on", "off"):
                first[s].append(got[s][0][0])
                later[s] += [t for t, _, _ in got[s][1:]]
            cached += [c for _, c, _ in got["on"][1:]]
            same += sum(x[2] == y[2] for x, y in zip(got["on"], got["off"], strict=True))
            n += len(got["on"])
        p50 = {s: statistics.median(v) for s, v in later.items()}
        res[workload] = {
            "ttft_later_p50_ms": {s: 1000 * v for s, v in p50.items()},
            "ttft_first_p50_ms": {s: 1000 * statistics.median(v) for s, v in first.items()},
            "speedup_later_p50": p50["off"] / p50["on"],
            "cached_tokens_p50": statistics.median(cached),
            "identical": same, "answers": n,
        }
        print(workload, res[workload], flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"args": vars(a), "results": res}, indent=1))
    lines = ["| workload | TTFT p50 of later turns, off / on (ms) | off/on "
             "| first turn p50 off / on (ms) | cached tokens p50 | identical |",
             "|---|---|---|---|---|---|"]
    for w, r in res.items():
        t, f = r["ttft_later_p50_ms"], r["ttft_first_p50_ms"]
        lines.append(f"| {w} | {t['off']:.1f} / {t['on']:.1f} | {r['speedup_later_p50']:.2f}x | "
                     f"{f['off']:.1f} / {f['on']:.1f} | {r['cached_tokens_p50']:.0f} | "
                     f"{r['identical']}/{r['answers']} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
