"""`make demo` / `recallspec demo`: a few built-in prompts, AR vs speculative, one table.

The prompts were written for this project and cover the cases where drafts recalled
from the prompt pay off: summarising a given text, editing given code, answering
from a given document, plus free chat where they mostly do not.
"""

from __future__ import annotations

import argparse
import statistics

from recallspec.markdown import table
from recallspec.policy import POLICY

DEMO_PROMPTS: tuple[tuple[str, str], ...] = (
    (
        "summarise",
        "Summarise the following notice in two sentences.\n\n"
        "Notice: The city library on Elm Street will close for renovation from 3 March to "
        "28 April. During the closure, books can be returned at the Riverside branch, which "
        "will extend its opening hours to 8 pm on weekdays. The renovation adds a children's "
        "reading room, new study desks with power outlets, and a lift to the first floor. "
        "Library cards remain valid, and loans due during the closure are extended until "
        "the library reopens on 29 April.",
    ),
    (
        "edit code",
        "Rename the function `avg` to `mean` and add type hints. Return the whole file.\n\n"
        "```python\n"
        "def avg(values):\n"
        "    total = 0\n"
        "    for v in values:\n"
        "        total += v\n"
        "    return total / len(values)\n\n\n"
        "def spread(values):\n"
        "    m = avg(values)\n"
        "    return max(abs(v - m) for v in values)\n\n\n"
        "if __name__ == '__main__':\n"
        "    data = [3, 1, 4, 1, 5, 9, 2, 6]\n"
        "    print(avg(data), spread(data))\n"
        "```",
    ),
    (
        "document QA",
        "Answer using only the document.\n\n"
        "Document: The Aurora 3 kettle holds 1.7 litres and boils a full load in about four "
        "minutes. It switches off automatically when the water boils or when the kettle is "
        "lifted from its base. The limescale filter is removable and should be rinsed every "
        "two weeks in hard-water areas. The warranty covers two years from purchase and "
        "requires the original receipt.\n\n"
        "Question: How long is the warranty, and what does it require?",
    ),
    (
        "free chat",
        "Give me three tips for keeping houseplants healthy in winter.",
    ),
)


def run_demo(model: str | None = None, drafter: str = POLICY, max_new_tokens: int = 96,
             repeats: int = 3) -> list[dict[str, object]]:
    """AR vs ``drafter`` (a spec, ``name:key=value:...``, ``mode=`` included) per prompt."""
    from recallspec.decoding.sampling import SamplingParams
    from recallspec.drafters.spec import DrafterSpec
    from recallspec.engine import Engine, GenerationResult

    spec = DrafterSpec.parse(drafter)
    print(f"loading {model or 'the default model (SmolLM2-135M-Instruct)'} ...", flush=True)
    engine = Engine.load(model)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    # (A cost-aware drafter's cost curve is measured, once per machine, or read before
    # the first timed request's clock starts: ``Engine.generate``.)
    engine.generate(engine.encode_prompt("Hello", chat=True), SamplingParams(max_new_tokens=4),
                    drafter="none")
    rows: list[dict[str, object]] = []
    for name, prompt in DEMO_PROMPTS:
        ids = engine.encode_prompt(prompt, chat=True)
        ar_tps, sp_tps = [], []
        ar = sp = None
        for _ in range(repeats):
            # Both from a cold prefill: with prefix reuse the second would start from
            # the first one's KV of the same prompt.
            ar = engine.generate(ids, params, drafter="none", prefix_cache=False)
            sp = engine.generate(ids, params, drafter=spec, prefix_cache=False)
            assert isinstance(ar, GenerationResult) and isinstance(sp, GenerationResult)
            ar_tps.append(ar.tokens_per_s)
            sp_tps.append(sp.tokens_per_s)
        assert ar is not None and sp is not None
        a, s = statistics.median(ar_tps), statistics.median(sp_tps)
        # Each repeat times AR and then the drafter back to back; the speedup is the
        # median of those pairs' ratios, so a drift in the machine's speed between
        # repeats (shared VMs) does not leak into it.
        ratios = [x / y for x, y in zip(sp_tps, ar_tps, strict=True) if y]
        rows.append({
            "prompt": name, "new_tokens": sp.new_tokens, "ar_tokens_per_s": a,
            "spec_tokens_per_s": s, "speedup": statistics.median(ratios) if ratios else 0.0,
            "mean_accepted_tokens": sp.mean_accepted_tokens,
            "lossless": ar.token_ids == sp.token_ids,
        })
        print(f"  {name}: {sp.new_tokens} tokens, {a:.1f} -> {s:.1f} tok/s", flush=True)
    return rows


def format_table(rows: list[dict[str, object]], drafter: str) -> str:
    header = ("prompt", "new tokens", "AR tok/s", f"{drafter} tok/s", "speedup",
              "mean accepted", "lossless")
    body = [(r["prompt"], r["new_tokens"], f"{r['ar_tokens_per_s']:.1f}",
             f"{r['spec_tokens_per_s']:.1f}", f"{r['speedup']:.2f}x",
             f"{r['mean_accepted_tokens']:.2f}", "yes" if r["lossless"] else "NO")
            for r in rows]
    return table(header, body, align="-rrrrr-")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="built-in prompts: autoregressive vs speculative, one table")
    p.add_argument("--model", default=None)
    p.add_argument("--drafter", default=POLICY,
                   help=f"drafter spec, name:key=value:... (default: the policy, {POLICY})")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per prompt and method, alternating (the table shows medians)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    rows = run_demo(args.model, args.drafter, args.max_new_tokens, args.repeats)
    print()
    print(format_table(rows, args.drafter))
    return 0 if all(r["lossless"] for r in rows) else 1
