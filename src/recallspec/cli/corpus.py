"""`recallspec corpus generate`: a self-generated corpus (the model's own answers)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recallspec.cli import REPACK_CACHE_HELP
from recallspec.params import DEFAULT_WEIGHT_FORMAT, WEIGHT_FORMATS


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("corpus", help="build corpora for the static index")
    csub = p.add_subparsers(dest="corpus_command", required=True, metavar="SUBCOMMAND")
    g = csub.add_parser(
        "generate",
        help="sample the model's own answers to instruction prompts (resumable)",
        description="Answers every prompt of the given files (Alpaca, ShareGPT, GSM8K, MBPP, "
        "Spec-Bench ... records; the first user turn) with the model, sampled, batched, and "
        "appends one JSON line per prompt to --out. Re-running continues where it stopped. "
        "Index the result with `recallspec index build --corpus OUT`.",
    )
    g.add_argument("--prompts", nargs="+", required=True, metavar="FILE")
    g.add_argument("--out", required=True, type=Path, help=".jsonl file (appended to)")
    g.add_argument("--model", default=None)
    g.add_argument("--limit", type=int, default=None, help="at most N prompts in total")
    g.add_argument("--per-file", type=int, default=None,
                   help="only the first N prompts of each file (mixes the files)")
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--batch-size", type=int, default=8)
    g.add_argument("--max-prompt-tokens", type=int, default=1024)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--drafter", default="pld",
                   help="drafter used while generating, as name:key=value:... (lossless: the "
                   "same distribution; sized cost-aware unless :mode=fixed)")
    g.add_argument("--dtype", default=DEFAULT_WEIGHT_FORMAT, choices=WEIGHT_FORMATS,
                   help="weights: auto = a GGUF's own blocks (quantized kernel), float32 = "
                        "the dequantized reference")
    g.add_argument("--no-repack-cache", dest="repack_cache", action="store_false",
                   help=REPACK_CACHE_HELP)
    g.add_argument("--no-progress", action="store_true")
    g.set_defaults(handler=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from recallspec.data.selfgen import SelfGenConfig, generate_corpus, iter_prompts, read_done
    from recallspec.drafters.spec import DrafterSpec
    from recallspec.engine import Engine

    # The drafter is a spec like every --drafter, parsed once here (a malformed one fails
    # before the model loads); the engine takes the spec itself.
    cfg = SelfGenConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
        batch_size=args.batch_size, limit=args.limit, per_file=args.per_file,
        max_prompt_tokens=args.max_prompt_tokens,
        seed=args.seed, drafter=DrafterSpec.parse(args.drafter),
    )
    # Validate inputs before the (slow) model load.
    n = sum(1 for _ in iter_prompts(args.prompts, cfg.per_file))
    total = min(n, cfg.limit) if cfg.limit else n
    done = len(read_done(args.out))
    engine = Engine.load(args.model, dtype=args.dtype, max_batch_size=cfg.batch_size,
                         repack_cache=args.repack_cache)
    bar = tqdm(total=total, initial=min(done, total), unit="prompt", desc="generate",
               disable=args.no_progress, file=sys.stderr)

    def progress(k: int, tokens: int) -> None:
        bar.update(k)
        bar.set_postfix(tokens=tokens)

    counts = generate_corpus(engine, args.prompts, args.out, cfg, progress)
    bar.close()
    print(json.dumps(counts))
    return 0
