"""`recallspec serve`: the OpenAI-compatible HTTP server (``recallspec.server``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from recallspec.cli import KV_HELP, MAX_DRAFT_NODES_HELP, REPACK_CACHE_HELP
from recallspec.errors import DataError, RecallspecError
from recallspec.params import (
    DEFAULT_KV_DTYPE,
    DEFAULT_POOL_BYTES,
    DEFAULT_POOL_TOKENS,
    DEFAULT_WEIGHT_FORMAT,
    KV_DTYPES,
    WEIGHT_FORMATS,
)
from recallspec.policy import SERVE_POLICY

if TYPE_CHECKING:
    from recallspec.engine import Engine


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI API (completions, chat) over HTTP")
    p.add_argument("--model", default=None,
                   help="GGUF file, HF directory or alias (default: SmolLM2-135M-Instruct)")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients send (default: --model, or the default alias)")
    p.add_argument("--drafter", default=None,
                   help="default drafter for requests that name none, as name:key=value:... "
                   "(:mode=fixed for fixed draft sizes; default: the measured serving "
                   f"policy, {SERVE_POLICY}); 'none' turns speculation off")
    p.add_argument("--mode", default=None,
                   help="mode of requests that state none: adaptive or fixed (draft sizing). "
                   "Default: each request's drafter sized as its spec says, else cost-aware. "
                   "(Batches are always unpadded, EMS-SD; its padded layouts are a benchmark "
                   "ablation: benchmarks/experiments/exp_batch.py)")
    p.add_argument("--index", default=None,
                   help="corpus index file for the default drafter (sam, sam+recycling, ...)")
    p.add_argument("--memory-tokens", type=int, default=0, metavar="N",
                   help="response memory: the past outputs of a tenant (the request's `user` "
                   "or recallspec.tenant) the sam drafters draft from, up to N tokens per "
                   "tenant, oldest evicted first (default 0: off)")
    p.add_argument("--memory-prompts", action="store_true",
                   help="keep the requests' prompts in the response memory too")
    p.add_argument("--memory-prompt-tail", type=int, default=None, metavar="N",
                   help="without --memory-prompts: keep each output behind its prompt's last "
                   "N tokens, so the same question asked again drafts the earlier answer "
                   "from its first token (default: the engine's, 32; 0: outputs alone)")
    p.add_argument("--memory-snapshot", default=None, metavar="FILE",
                   help="save the response memory to FILE when the server stops and load it "
                   "when it starts (if FILE exists)")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template file to use instead of the model's (e.g. one "
                   "that renders tools; default: the model's own, and for tools on a ChatML "
                   "model whose template has none, the shipped chatml_tools.jinja)")
    p.add_argument("--corpus-dir", default=None, metavar="DIR",
                   help="the only directory POST /v1/corpora may load files from (documents "
                   "or index files; default: none, documents in the request body only)")
    p.add_argument("--max-batch-size", type=int, default=8,
                   help="requests decoded together (KV-cache slots)")
    p.add_argument("--max-waiting", type=int, default=256,
                   help="requests waiting for a slot before new ones get 429")
    p.add_argument("--max-len", type=int, default=None, help="KV positions per request")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="prefill every prompt from its first token (default: a request starts "
                        "from the KV a finished request of its tenant left for the longest "
                        "prefix of its prompt: a chat's next turn, an agent's next step)")
    p.add_argument("--prefix-cache-tokens", type=int, default=None, metavar="N",
                   help="tokens of evicted slots' KV kept in memory for reuse (default "
                        f"{DEFAULT_POOL_TOKENS} or {DEFAULT_POOL_BYTES >> 30} GiB of keys and "
                        "values, whichever is fewer; 0: only what the free slots hold)")
    p.add_argument("--kv-budget-tokens", type=int, default=None, metavar="N",
                   help="KV rows the slots and the prefix pool may hold at once (default: "
                        "as many as 80%% of the memory available at start holds)")
    p.add_argument("--max-draft-nodes", type=int, default=None, metavar="N",
                   help=MAX_DRAFT_NODES_HELP)
    p.add_argument("--dtype", default=DEFAULT_WEIGHT_FORMAT, choices=WEIGHT_FORMATS)
    p.add_argument("--kv-dtype", default=DEFAULT_KV_DTYPE, choices=KV_DTYPES, help=KV_HELP)
    p.add_argument("--no-repack-cache", dest="repack_cache", action="store_false",
                   help=REPACK_CACHE_HELP)
    p.add_argument("--cost-curve", default="background", choices=["background", "start"],
                   help="when a model's verification cost curve is first measured (once per "
                        "model and machine, then cached): 'background' serves at "
                        "once, drafts priced conservatively until the curve is measured in "
                        "idle time (/health says cost_curve: measuring); 'start' measures it "
                        "before serving (benchmarks)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("RECALLSPEC_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (env RECALLSPEC_API_KEY)")
    p.add_argument("--log-level", default="warning",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(handler=run)


def measures_at_start(engine: Engine) -> bool:
    """Whether the server reads or measures the cost curve at start (before it serves
    with ``--cost-curve start``, else in the background): only when the default
    drafting, what a request naming no drafter gets, drafts and is sized cost-aware, so
    that the first requests do not wait for the measurement. Plain
    decoding (``--drafter none``) never measures at start; a request that names a
    drafter sized adaptive has it measured then, once (``Engine.add_request``; in the
    background unless ``--cost-curve start``). Resolving
    the default drafting also checks it: a bad default drafter or index fails at start,
    not per request."""
    from recallspec.drafters.spec import NO_DRAFTER

    how = engine.drafters.drafting(None)
    return how.drafter.name != NO_DRAFTER and how.sizing == "adaptive"


def load_engine(model: str | None, config: dict[str, object],
                chat_template: str | None = None) -> Engine:
    """``Engine.load(model, **config)``, its tokenizer's chat template replaced by
    ``chat_template`` where one is given (``--chat-template``)."""
    from recallspec.engine import Engine, EngineConfig
    from recallspec.models import load_model

    if chat_template is None:
        return Engine.load(model, **config)
    cfg = EngineConfig(model=model, **config)  # type: ignore[arg-type]
    m, tok = load_model(model, dtype=cfg.dtype, kv_dtype=cfg.kv_dtype,
                        repack_cache=cfg.repack_cache)
    return Engine(m, tok.with_chat_template(chat_template), cfg)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from recallspec.drafters.spec import DrafterSpec
    from recallspec.models.loader import DEFAULT_MODEL
    from recallspec.server import EngineLoop, Metrics, create_app
    from recallspec.server.tool_support import ToolSupport

    if args.max_waiting < 0:
        raise DataError("--max-waiting must be >= 0")
    if args.memory_tokens < 0:
        raise DataError("--memory-tokens must be >= 0 (0: no response memory)")
    if args.memory_prompt_tail is not None and args.memory_prompt_tail < 0:
        raise DataError("--memory-prompt-tail must be >= 0")
    for flag, value in (("--memory-prompts", args.memory_prompts),
                        ("--memory-snapshot", args.memory_snapshot)):
        if value and not args.memory_tokens:
            raise DataError(f"{flag} needs a response memory (--memory-tokens N)")
    chat_template = None
    if args.chat_template is not None:
        try:
            chat_template = Path(args.chat_template).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"--chat-template {args.chat_template}: {e}") from None
    corpus_dir = None
    if args.corpus_dir is not None:
        corpus_dir = Path(args.corpus_dir).resolve()
        if not corpus_dir.is_dir():
            raise DataError(f"--corpus-dir {args.corpus_dir}: not a directory")
    # The default drafter: the measured serving policy (recallspec/policy.py) unless
    # --drafter, parsed once here; the engine config takes the spec itself.
    drafter = DrafterSpec.parse(args.drafter or SERVE_POLICY)
    if args.index is not None:
        drafter = drafter.with_options({"index": args.index})
    try:
        config: dict[str, object] = {"max_batch_size": args.max_batch_size, "dtype": args.dtype,
                                     "kv_dtype": args.kv_dtype,
                                     "repack_cache": args.repack_cache,
                                     "drafter": drafter, "mode": args.mode,
                                     "memory_tokens": args.memory_tokens,
                                     "memory_prompts": args.memory_prompts,
                                     "memory_snapshot": args.memory_snapshot,
                                     "prefix_cache": args.prefix_cache}
        if args.memory_prompt_tail is not None:
            config["memory_prompt_tail"] = args.memory_prompt_tail
        if args.max_len is not None:
            config["max_len"] = args.max_len
        if args.max_draft_nodes is not None:
            config["max_draft_nodes"] = args.max_draft_nodes
        if args.prefix_cache_tokens is not None:
            config["prefix_cache_tokens"] = args.prefix_cache_tokens
        if args.kv_budget_tokens is not None:
            config["kv_budget_tokens"] = args.kv_budget_tokens
        engine = load_engine(args.model, config, chat_template)
    except ValueError as e:
        raise DataError(str(e)) from None
    engine.curves.background = args.cost_curve == "background"
    if measures_at_start(engine):  # (a bad default drafter or index fails here, at start)
        if args.cost_curve == "start":
            engine.cost_curve()
        else:
            engine.start_cost_curve()
    name = args.served_model_name or args.model or DEFAULT_MODEL
    metrics = Metrics(name)
    loop = EngineLoop(engine, metrics, max_waiting=args.max_waiting)

    def shutdown() -> None:  # uvicorn's graceful stop (SIGTERM, Ctrl-C), before it exits
        loop.stop()
        if args.memory_snapshot:
            try:
                size = engine.save_memory()
                print(f"recallspec: response memory saved to {args.memory_snapshot} "
                      f"({size} bytes)", file=sys.stderr, flush=True)
            except (OSError, RecallspecError) as e:
                print(f"recallspec: the response memory was not saved: {e}", file=sys.stderr,
                      flush=True)
        engine.close()

    tools = ToolSupport.of(engine.tokenizer)
    app = create_app(loop, model_name=name, api_key=args.api_key, corpus_dir=corpus_dir,
                     on_shutdown=shutdown, tools=tools)
    loop.start()
    print(f"recallspec: serving {name} on http://{args.host}:{args.port}/v1 "
          f"(drafter {drafter}, batch {args.max_batch_size}, {tools.describe()}"
          + (f", memory {args.memory_tokens} tokens per tenant" if args.memory_tokens else "")
          + (f", corpora from {corpus_dir}" if corpus_dir else "") + ")",
          file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                    access_log=args.log_level in ("info", "debug"))
    finally:
        loop.stop()
    return 0
