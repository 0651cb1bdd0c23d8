"""`recallspec generate`: one prompt, any drafter, optional lossless check."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from recallspec.cli import KV_HELP
from recallspec.errors import DataError
from recallspec.policy import POLICY


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt")
    p.add_argument(
        "--model", default=None,
        help="GGUF file, HF directory or alias (default: SmolLM2-135M-Instruct)",
    )
    p.add_argument("--drafter", default=POLICY,
                   help="drafter name (none, pld, llma, ...), options as name:key=value:... "
                   "(e.g. crest:datastore=chat.crest, sam:index=x.rsidx:delta=3; "
                   f"default: the measured policy, {POLICY})")
    p.add_argument("--prompt", required=True, help="prompt text ('-' reads stdin)")
    p.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the model's chat template"
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--dtype", default="auto", choices=["auto", "quantized", "float32", "bfloat16"],
                   help="weights: auto = a GGUF's own blocks (quantized kernel), float32 = "
                        "the dequantized reference")
    p.add_argument("--kv-dtype", default="auto", choices=["auto", "float32", "float16"],
                   help=KV_HELP)
    p.add_argument("--max-draft-nodes", type=int, default=16)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--verify-lossless", action="store_true",
        help="also decode autoregressively and report lossless and speedup",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from recallspec.drafters import available_drafters
    from recallspec.engine import Engine, GenerationResult
    from recallspec.errors import UnknownNameError
    from recallspec.spec.sampling import SamplingParams

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise DataError("empty prompt")
    from recallspec.drafters.base import parse_spec

    drafter, options = parse_spec(args.drafter)
    mode = str(options.pop("mode", "ems"))
    if drafter not in available_drafters():
        raise UnknownNameError(
            f"unknown drafter {drafter!r}; available: {', '.join(available_drafters())}"
        )
    try:
        params = SamplingParams(
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            max_new_tokens=args.max_new_tokens, stop=tuple(args.stop), seed=args.seed,
        )
    except ValueError as e:
        raise DataError(str(e)) from None
    engine = Engine.load(args.model, dtype=args.dtype, kv_dtype=args.kv_dtype,
                         max_draft_nodes=args.max_draft_nodes)
    ids = engine.encode_prompt(prompt, chat=args.chat)
    # Warm up so that one-time costs (allocator, first matmul) do not land in the timing.
    engine.generate(ids[:8], SamplingParams(max_new_tokens=2), drafter="none")
    res = engine.generate(ids, params, drafter=drafter, drafter_options=options, mode=mode)
    assert isinstance(res, GenerationResult)
    out: dict[str, Any] = {
        "text": res.text,
        "new_tokens": res.new_tokens,
        "steps": res.steps,
        "mean_accepted_tokens": round(res.mean_accepted_tokens, 4),
        "tokens_per_s": round(res.tokens_per_s, 3),
        "finish_reason": res.finish_reason,
        "drafter": args.drafter,
    }
    if args.verify_lossless:
        base = engine.generate(ids, params, drafter="none")
        assert isinstance(base, GenerationResult)
        out["lossless"] = base.token_ids == res.token_ids if params.greedy else None
        out["ar_tokens_per_s"] = round(base.tokens_per_s, 3)
        out["speedup"] = (
            round(res.tokens_per_s / base.tokens_per_s, 4) if base.tokens_per_s else None
        )
    if args.json:
        print(json.dumps(out))
    else:
        print(res.text)
        stats = ", ".join(f"{k}={v}" for k, v in out.items() if k != "text")
        print(f"\n[{stats}]", file=sys.stderr)
    return 0
