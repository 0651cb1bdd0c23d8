"""Engine time per step outside the forward, at batch 1 (issue 18 item 3).

    .venv/bin/python benchmarks/experiments/exp_step_overhead.py none llma
    .venv/bin/python benchmarks/experiments/exp_step_overhead.py none llma --temperature 0.7
    .venv/bin/python benchmarks/experiments/exp_step_overhead.py none --batch 8 \\
        --temperature 0.7

For each drafter (a spec; without :mode= at fixed sizes, ``:mode=adaptive`` for
cost-aware sizing): one prompt, 256 new tokens (EOS ignored), 5 runs after a warm-up; the
run with the median decode time reports, per decoding step, the wall time, the time
inside the forward (``Engine.stats.forward_s``), the drafting time, and the rest
(verification, commit, KV bookkeeping, acceptance statistics, Python dispatch).
With ``--temperature`` > 0 the tokens are sampled (seed 0 each run); with ``--batch`` B,
B requests (seeds 0..B-1 when sampling) decode together and only their decode tokens/s
is reported. (``RECALLSPEC_STEP_TEMPERATURE`` and ``RECALLSPEC_STEP_BATCH``, the
environment variables earlier runs set, are the options' defaults.)

Feeds the notebook docs/history/benchmarks_2026-11.md, "Profile of one step (native
forward, SmolLM2, 200 cached tokens, idle machine)": the engine's step outside the forward.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from recallspec import Engine, SamplingParams
from recallspec.drafters.spec import DrafterSpec

PROMPT = ("Summarize the following text in three sentences.\n\n" + " ".join(
    f"Sentence {i} says that the river near the old mill was cold in winter." for i in range(12)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("drafters", nargs="*", default=["none", "llma"],
                    help="drafter specs (default: none llma)")
    ap.add_argument("--temperature", type=float,
                    default=float(os.environ.get("RECALLSPEC_STEP_TEMPERATURE", "0")))
    ap.add_argument("--batch", type=int, default=int(os.environ.get("RECALLSPEC_STEP_BATCH", "1")))
    a = ap.parse_args()
    temperature, batch = a.temperature, a.batch
    for drafter in a.drafters:
        # A drafter named without a sizing drafts fixed sizes here (stated: the engine's
        # default is cost-aware), so every step drafts what the drafter proposes.
        spec = DrafterSpec.parse(drafter)
        if spec.sizing is None:
            spec = replace(spec, sizing="fixed")
        eng = Engine.load(drafter=spec, max_batch_size=batch)
        params = [SamplingParams(max_new_tokens=256, ignore_eos=True, temperature=temperature,
                                 seed=i if temperature else None) for i in range(batch)]
        eng.generate([PROMPT] * batch, params)  # warm-up
        runs = []
        for _ in range(5):
            eng.generate([PROMPT] * batch, params)
            s = eng.stats
            runs.append((s.decode_only_s, s.steps, s.decode_only_tokens, s.forward_s, s.draft_s))
        wall, steps, tokens, fwd, draft = sorted(runs)[len(runs) // 2]
        if batch > 1:  # (forward_s also holds the steps that prefill a later request,
            # which decode_only_s leaves out: no split here)
            print(f"{drafter} x{batch}: {tokens} decode tokens, {tokens / wall:.1f} tok/s")
            continue
        print(f"{drafter}: {steps} steps, {tokens} decode tokens, {tokens / wall:.1f} tok/s; "
              f"per step {wall / steps * 1e3:.3f} ms: forward {fwd / steps * 1e3:.3f} ms, "
              f"drafting {draft / steps * 1e3:.3f} ms, "
              f"outside the forward {(wall - fwd) / steps * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
