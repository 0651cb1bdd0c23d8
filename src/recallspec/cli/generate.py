"""`recallspec generate`: one prompt, any drafter, optional lossless check."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from recallspec.cli import KV_HELP, MAX_DRAFT_NODES_HELP, REPACK_CACHE_HELP
from recallspec.errors import DataError
from recallspec.params import DEFAULT_KV_DTYPE, DEFAULT_WEIGHT_FORMAT, KV_DTYPES, WEIGHT_FORMATS
from recallspec.policy import POLICY


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt")
    p.add_argument(
        "--model", default=None,
        help="GGUF file, HF directory or alias (default: SmolLM2-135M-Instruct)",
    )
    p.add_argument("--drafter", default=POLICY,
                   help="drafter name (none, pld, llma, ...), options as name:key=value:... "
                   "(e.g. crest:datastore=chat.crest, sam:index=x.rsidx:delta=3); drafts are "
                   "sized cost-aware unless the spec says :mode=fixed "
                   f"(default: the measured policy, {POLICY})")
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
    p.add_argument("--dtype", default=DEFAULT_WEIGHT_FORMAT, choices=WEIGHT_FORMATS,
                   help="weights: auto = a GGUF's own blocks (quantized kernel), float32 = "
                        "the dequantized reference")
    p.add_argument("--kv-dtype", default=DEFAULT_KV_DTYPE, choices=KV_DTYPES, help=KV_HELP)
    p.add_argument("--no-repack-cache", dest="repack_cache", action="store_false",
                   help=REPACK_CACHE_HELP)
    p.add_argument("--max-draft-nodes", type=int, default=None, metavar="N",
                   help=MAX_DRAFT_NODES_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--verify-lossless", action="store_true",
        help="also decode autoregressively and report lossless and speedup",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from recallspec.decoding.sampling import SamplingParams
    from recallspec.drafters import available_drafters
    from recallspec.drafters.spec import DrafterSpec
    from recallspec.engine import Engine, GenerationResult
    from recallspec.errors import UnknownNameError

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise DataError("empty prompt")
    spec = DrafterSpec.parse(args.drafter)  # parsed once; the engine takes the object
    if spec.name not in available_drafters():
        raise UnknownNameError(
            f"unknown drafter {spec.name!r}; available: {', '.join(available_drafters())}"
        )
    try:
        params = SamplingParams(
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            max_new_tokens=args.max_new_tokens, stop=tuple(args.stop), seed=args.seed,
        )
    except ValueError as e:
        raise DataError(str(e)) from None
    # Only a given --max-draft-nodes: its default is the engine config's (params.py).
    limits: dict[str, int] = ({} if args.max_draft_nodes is None
                              else {"max_draft_nodes": args.max_draft_nodes})
    try:
        engine = Engine.load(args.model, dtype=args.dtype, kv_dtype=args.kv_dtype,
                             repack_cache=args.repack_cache, **limits)
    except ValueError as e:  # EngineConfig's checks (e.g. a negative --max-draft-nodes)
        raise DataError(str(e)) from None
    ids = engine.encode_prompt(prompt, chat=args.chat)
    # Warm up so that one-time costs (allocator, first matmul) do not land in the timing.
    engine.generate(ids[:8], SamplingParams(max_new_tokens=2), drafter="none")
    res = engine.generate(ids, params, drafter=spec, prefix_cache=False)  # (not the warm-up's KV)
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
        # From a cold prefill, as ``res`` was: with prefix reuse it would start from
        # res's KV of the same prompt, and the speedup would read low.
        base = engine.generate(ids, params, drafter="none", prefix_cache=False)
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
