"""Issue 21's headroom on self-consistency and code editing: how many tokens a step could
accept at best, with and without the response memory, on the answers a `recallspec bench
repeat` run actually produced.

For every self-consistency or code-editing answer (in the order the server saw them; a
code-editing follow-up's prompt holds the conversation so far, as the bench sent it),
walk its tokens:
at position t one step accepts the longest prefix of output[t:] (at most K tokens) that
occurs *anywhere* in the allowed sources, plus the model's own next token. That is more
than any recall drafter can propose (a drafter continues a match of the text's suffix;
this oracle may take any substring, and it knows the sampled future), so its tokens per
step bound every drafter drawing from those sources, trees included (each path of a
recall tree is a substring of one source). Sources: the request's own text (prompt +
output[:t]) alone, or also the tenant's earlier answers, each behind its prompt's last
32 tokens as the server keeps them. (Sampling with a deterministic draft accepts a
drafted token exactly when the sampled token equals it, so walking the realised answers
is exact in distribution.)

    .venv/bin/python scripts/exp_memory_oracle.py bench_out/repeat3/report.json [--k 64]
        [--out bench_out/memory_oracle]

Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recallspec.engine.prompts import encode_chat
from recallspec.models import load_tokenizer

PROMPT_TAIL = 32  # the server's default --memory-prompt-tail
WORKLOADS = ("self_consistency", "code_edit")


def occurs(needle: list[int], text: list[int]) -> bool:
    n = len(needle)
    return any(text[p] == needle[0] and text[p : p + n] == needle
               for p in range(len(text) - n + 1))


def longest_prefix(out: list[int], t: int, texts: Sequence[list[int]], k: int) -> int:
    """The longest l <= k such that out[t:t+l] is a substring of one of `texts`."""
    best = 0
    for text in texts:
        while best < min(k, len(out) - t) and occurs(out[t : t + best + 1], text):
            best += 1
    return best


def oracle_steps(out: list[int], prompt: list[int], earlier: Sequence[list[int]],
                 k: int) -> int:
    """Steps the oracle needs for `out` with the own text and the `earlier` answers."""
    t = steps = 0
    while t < len(out):
        t += longest_prefix(out, t, [prompt + out[:t], *earlier], k) + 1
        steps += 1
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="report.json of `recallspec bench repeat`")
    ap.add_argument("--k", type=int, default=64, help="most tokens one step may accept")
    ap.add_argument("--out", default="bench_out/memory_oracle")
    args = ap.parse_args()
    rep = json.loads(Path(args.report).read_text(encoding="utf-8"))
    tok = load_tokenizer(None)
    convs = {c["id"]: c for c in rep["conversations"]}
    rows: list[dict[str, Any]] = []
    for server, workload in [(s, w) for w in WORKLOADS for s in rep["servers"]]:
        recs = [r for r in rep["records"] if r["server"] == server and r["ok"]
                and r["workload"] == workload]
        if not recs:
            continue
        memory: dict[str, list[list[int]]] = defaultdict(list)
        # the conversation so far, per (conversation, sample): earlier turns of one send
        said: dict[tuple[str, int], list[dict[str, str]]] = defaultdict(list)
        tokens = actual = own = both = 0
        for r in recs:
            conv = convs[r["conversation"]]
            turn = r.get("turn", 0)
            key = (conv["id"], r.get("sample", 0))
            history = said[key] if conv.get("history") else []
            messages = [*history, {"role": "user", "content": conv["turns"][turn]}]
            prompt = encode_chat(tok, messages)
            if len(prompt) != r["prompt_tokens"]:
                raise SystemExit(f"{conv['id']} turn {turn}: rebuilt prompt has "
                                 f"{len(prompt)} tokens, the server saw {r['prompt_tokens']}")
            said[key] = [*messages, {"role": "assistant", "content": r["text"]}]
            out: list[int] = r["token_ids"]
            earlier = memory[conv["tenant"]]
            own += oracle_steps(out, prompt, [], args.k)
            both += oracle_steps(out, prompt, earlier, args.k)
            tokens += len(out)
            actual += r["steps"]
            earlier.append(prompt[-PROMPT_TAIL:] + out)
        rows.append({"server": server, "workload": workload, "answers": len(recs), "tokens": tokens,
                     "tokens_per_step_actual": tokens / actual,
                     "tokens_per_step_oracle_own": tokens / own,
                     "tokens_per_step_oracle_own_and_memory": tokens / both,
                     "oracle_memory_gain": own / both})
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.with_suffix(".json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    lines = [f"Answers of `{args.report}`, at most {args.k} tokens a step.", "",
             "| workload | server | answers | tokens | tokens/step (run) | oracle, own text | "
             "oracle, own text + memory | memory's gain to the oracle |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['workload']} | {r['server']} | {r['answers']} | {r['tokens']} | "
              f"{r['tokens_per_step_actual']:.3f} | {r['tokens_per_step_oracle_own']:.3f} | "
              f"{r['tokens_per_step_oracle_own_and_memory']:.3f} | "
              f"{r['oracle_memory_gain']:.3f}x |" for r in rows]
    md = "\n".join(lines) + "\n"
    out_path.with_suffix(".md").write_text(md, encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
