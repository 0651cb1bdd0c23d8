"""Engine time per step outside the forward, at batch 1 (issue 18 item 3).

    .venv/bin/python scripts/exp_step_overhead.py none llma
    RECALLSPEC_STEP_TEMPERATURE=0.7 .venv/bin/python scripts/exp_step_overhead.py none llma

For each drafter: one prompt, 256 new tokens (EOS ignored), 5 runs after a warm-up; the
run with the median decode time reports, per decoding step, the wall time, the time
inside the forward (``Engine.stats.forward_s``), the drafting time, and the rest
(verification, commit, KV bookkeeping, acceptance statistics, Python dispatch).
With ``RECALLSPEC_STEP_TEMPERATURE`` > 0 the tokens are sampled (seed 0 each run).
"""

from __future__ import annotations

import os
import sys

from recallspec import Engine, SamplingParams

PROMPT = ("Summarize the following text in three sentences.\n\n" + " ".join(
    f"Sentence {i} says that the river near the old mill was cold in winter." for i in range(12)))


def main(drafters: list[str]) -> None:
    for drafter in drafters or ["none", "llma"]:
        eng = Engine.load(drafter=drafter)
        temperature = float(os.environ.get("RECALLSPEC_STEP_TEMPERATURE", "0"))
        params = SamplingParams(max_new_tokens=256, ignore_eos=True, temperature=temperature,
                                seed=0 if temperature else None)
        eng.generate(PROMPT, params)  # warm-up
        runs = []
        for _ in range(5):
            eng.generate(PROMPT, params)
            s = eng.stats
            runs.append((s.decode_only_s, s.steps, s.decode_only_tokens, s.forward_s, s.draft_s))
        wall, steps, tokens, fwd, draft = sorted(runs)[len(runs) // 2]
        print(f"{drafter}: {steps} steps, {tokens} decode tokens, {tokens / wall:.1f} tok/s; "
              f"per step {wall / steps * 1e3:.3f} ms: forward {fwd / steps * 1e3:.3f} ms, "
              f"drafting {draft / steps * 1e3:.3f} ms, "
              f"outside the forward {(wall - fwd) / steps * 1e3:.3f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
