"""`recallspec bench scale`: ours vs native llama.cpp at published model shapes.

    recallspec bench scale [--shapes smollm2-1.7b,llama-3.1-8b] [--quants Q4_K_M,Q4_0]
        [--answers bench_out] [--out bench_out/scale]

See ``bench/scale/command.py`` for what is measured; ``--answers`` adds the predicted
Spec-Bench speed of our methods at each shape. The parser reads the light settings module
(``bench/scale/config.py``); the handler imports the benchmark itself when it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from recallspec.bench.common.args import positive_ints
from recallspec.bench.scale.config import (
    PREDICT_METHODS,
    ScaleConfig,
    parse_entries,
    seq_counts,
)


def register(bsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = ScaleConfig()
    sc = bsub.add_parser(
        "scale", help="ours vs native llama.cpp at published model shapes (random-weight "
        "GGUFs): decode, prefill, verification curve, memory, predicted Spec-Bench speed")
    sc.add_argument("--shapes", default=None,
                    help="comma-separated shapes (default: the full matrix; see "
                    "`recallspec.bench.common.shapes.SHAPES`); NAME-L<n>: that shape with "
                    "its first n layers, labelled reduced by its name (e.g. "
                    "qwen3-30b-a3b-L8)")
    sc.add_argument("--quants", default=None, help="comma-separated: Q4_K_M, Q4_0, Q8_0, "
                    "MXFP4_MOE (mixtures of experts only, e.g. gpt-oss-20b) (with --shapes: "
                    "their product; default Q4_K_M)")
    sc.add_argument("--repeats", type=int, default=d.repeats)
    sc.add_argument("--new-tokens", type=int, default=d.new_tokens, help="decode tokens")
    sc.add_argument("--prefill", type=int, default=d.prefill, help="prompt tokens of prefill")
    sc.add_argument("--ks", type=positive_ints, default=",".join(map(str, d.ks)),
                    help="verification rows")
    sc.add_argument("--cached", type=int, default=d.cached,
                    help="cached tokens under the verification curve")
    sc.add_argument("--threads", type=int, default=None, help="both engines (default: all CPUs)")
    sc.add_argument("--no-llamacpp", action="store_true", help="ours only")
    sc.add_argument("--answers", default=None,
                    help="a `recallspec bench` output directory of SmolLM2 on Spec-Bench with "
                    "ar and the drafting methods: adds predicted tokens/s at each shape")
    sc.add_argument("--methods", default=",".join(PREDICT_METHODS),
                    help="methods to predict (with --answers; must include ar)")
    sc.add_argument("--decode-rounds", type=int, default=d.decode_rounds,
                    help="paired decode rounds after each entry: ours and llama-bench tg "
                    "back to back, order alternating (the ratio least moved by a drifting "
                    "machine; 0: none)")
    sc.add_argument("--prefill-rounds", type=int, default=d.prefill_rounds,
                    help="paired prefill rounds after each entry: ours and llama-bench pp, "
                    "as the decode rounds (0: none)")
    sc.add_argument("--ttft-repeats", type=int, default=d.ttft_repeats,
                    help="time to first token from fresh processes (ours first and later "
                    "run, llama-server), repeats per model (0: not measured)")
    sc.add_argument("--batch-seqs", type=seq_counts, default=None,
                    help="sequences per forward of the batched verification curve: one "
                    "forward of B sequences (each its own random context of --cached "
                    "tokens) of --batch-ks rows each, beside one sequence's chain of B x k "
                    "rows, the experts woken and the cost model's price (default: 1,2,4,8 "
                    "for a mixture of experts, none for a dense shape; 0: none)")
    sc.add_argument("--batch-ks", type=positive_ints, default=",".join(map(str, d.batch_ks)),
                    help="draft rows per sequence of the batched verification curve")
    sc.add_argument("--overwrite", action="store_true",
                    help="measure again the entries already in OUT/scale.json")
    sc.add_argument("--out", default="bench_out/scale", help="output directory")
    sc.set_defaults(handler=run_scale_cmd)


def run_scale_cmd(args: argparse.Namespace) -> int:
    # torch and the engine, only when the benchmark runs (see the module docstring).
    from recallspec.bench.scale.command import run_scale
    from recallspec.bench.scale.report import render_scale_markdown

    cfg = ScaleConfig(
        entries=parse_entries(args.shapes, args.quants), repeats=args.repeats,
        new_tokens=args.new_tokens, prefill=args.prefill, ks=args.ks,
        cached=args.cached, threads=args.threads, llamacpp=not args.no_llamacpp,
        answers=args.answers, methods=tuple(m.strip() for m in args.methods.split(",")
                                            if m.strip()),
        overwrite=args.overwrite, decode_rounds=args.decode_rounds,
        prefill_rounds=args.prefill_rounds,
        ttft_repeats=args.ttft_repeats, batch_seqs=args.batch_seqs, batch_ks=args.batch_ks,
    )
    out = Path(args.out)
    res = run_scale(cfg, out)
    print(render_scale_markdown(res))
    print(f"scale.json, scale.md and scale.png in {out}")
    return 0
