"""Time to first token of later turns with the prefix cache on and off (issue 38), one
request at a time on one engine per setting, interleaved per conversation.

    .venv/bin/python benchmarks/experiments/exp_prefix_ttft.py [--conversations 16]
        [--max-new-tokens 64] [--out bench_out/prefix/ttft]

Workloads (and ``round_robin``: more conversations than slots, with and without the
pool): MT-Bench's two-turn questions (turn 2 = turn 1, its answer and the second
question) and an agent-style loop built from the same questions (each of 4 steps re-sends
the whole transcript plus a tool result). TTFT here is the engine's ``prefill_time``
(admission to the first token; no queueing: one request at a time). Every answer is
checked equal with the cache on and off. Writes OUT.json and OUT.md.

Feeds docs/BENCHMARKS.md, "Agents and RAG" (one request at a time).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from _common import write_outputs

from recallspec import Engine, SamplingParams
from recallspec.bench.common.suites import SuiteSelection, load_suite
from recallspec.engine import EngineConfig
from recallspec.markdown import table_lines

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


def round_robin(base: Engine, convs: list[tuple[str, list[str]]],
                params: SamplingParams) -> dict[str, Any]:
    """Every conversation's first turn, then every second turn, on engines of 8 slots
    (fewer than the conversations): the slots alone lose most first turns before their
    second comes; the pool keeps them. TTFT p50 of the second turns per setting."""
    settings: dict[str, dict[str, Any]] = {
        "off": {"prefix_cache": False}, "slots": {"prefix_cache_tokens": 0}, "pool": {}}
    ttft: dict[str, list[float]] = {}
    answers: dict[str, list[list[int]]] = {}
    cached: dict[str, list[int]] = {}
    for name, kw in settings.items():
        eng = Engine(base.model, base.tokenizer, EngineConfig(drafter="none", **kw))
        msgs = [[{"role": "user", "content": t[0]}] for _, t in convs]
        for m in msgs:
            r = eng.generate(eng.prompt_ids(m), params)
            m.append({"role": "assistant", "content": r.text})
        ttft[name], answers[name], cached[name] = [], [], []
        for m, (_, t) in zip(msgs, convs, strict=True):
            r = eng.generate(eng.prompt_ids([*m, {"role": "user", "content": t[1]}]), params)
            ttft[name].append(r.prefill_time)
            answers[name].append(r.token_ids)
            cached[name].append(r.cached_tokens)
    p50 = {k: statistics.median(v) for k, v in ttft.items()}
    return {"ttft_second_p50_ms": {k: 1000 * v for k, v in p50.items()},
            "hits": {k: sum(c > 0 for c in v) for k, v in cached.items()},
            "second_turns": len(convs),
            "identical_to_off": {k: sum(x == y for x, y in zip(v, answers["off"], strict=True))
                                 for k, v in answers.items()}}


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
    res["mt_bench_round_robin"] = round_robin(base, convs, params)
    print("mt_bench_round_robin", res["mt_bench_round_robin"], flush=True)
    rows = []
    for w, r in res.items():
        if w == "mt_bench_round_robin":
            continue
        t, f = r["ttft_later_p50_ms"], r["ttft_first_p50_ms"]
        rows.append([w, f"{t['off']:.1f} / {t['on']:.1f}", f"{r['speedup_later_p50']:.2f}x",
                     f"{f['off']:.1f} / {f['on']:.1f}", f"{r['cached_tokens_p50']:.0f}",
                     f"{r['identical']}/{r['answers']}"])
    lines = table_lines(["workload", "TTFT p50 of later turns, off / on (ms)", "off/on",
                         "first turn p50 off / on (ms)", "cached tokens p50", "identical"],
                        rows)
    rr = res["mt_bench_round_robin"]
    t = rr["ttft_second_p50_ms"]
    lines += ["", "Round robin (all first turns, then all second turns; 8 slots): TTFT p50 of "
              f"second turns off {t['off']:.1f} ms, slots only {t['slots']:.1f} ms "
              f"({rr['hits']['slots']}/{rr['second_turns']} hits), with the pool "
              f"{t['pool']:.1f} ms ({rr['hits']['pool']}/{rr['second_turns']} hits); "
              f"identical to off: {rr['identical_to_off']}"]
    write_outputs(a.out, {"args": vars(a), "results": res}, lines)


if __name__ == "__main__":
    main()
