"""`recallspec bench`: the benchmark suite and its sub-commands.

    recallspec bench --suite NAME [--methods ar,pld,...] ...   run a suite (no sub-command)
    recallspec bench report --out DIR                          re-render a run's report
    recallspec bench replay --answers DIR/answers/ar.jsonl --methods pld:mode=fixed,llma:mode=fixed
    recallspec bench replay --answers ... --methods ar,llma:mode=fixed,portfolio,oracle \
        --predict-time [--curve FILE] [--model-topk] [--out FILE]
    recallspec bench runtime [--model M] [--json] [--out DIR]
    recallspec bench serve --targets ours-off,llamacpp --rates 0.5,1,2 --out DIR [--url URL]
    recallspec bench repeat [--workloads self_consistency,code_edit,reask,spec_bench] --out DIR
    recallspec bench scale [--shapes S,S] [--quants Q4_K_M] [--answers DIR] [--out DIR]

More sub-commands plug in through ``_EXTRA_SUBCOMMAND_MODULES``: each module there
exposes ``register_bench(subparsers)`` and sets ``handler`` on its parser, exactly
like a top-level command module.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from recallspec.errors import DataError
from recallspec.params import DEFAULT_WEIGHT_FORMAT, MAX_DRAFT_NODES, WEIGHT_FORMATS
from recallspec.policy import POLICY

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    Settings = TypeVar("Settings", bound=DataclassInstance)

# Modules adding `recallspec bench <name>` sub-commands, in the order the help lists them.
_EXTRA_SUBCOMMAND_MODULES: tuple[str, ...] = ("recallspec.cli.bench_serve",
                                              "recallspec.cli.bench_scale")

# AR, the two simplest drafters (each sized cost-aware, as any named drafter) and the
# default policy (recallspec/policy.py).
DEFAULT_METHODS = f"ar,pld,llma,{POLICY}"
# `bench replay`'s methods: exact replay has no time to size by, so it replays fixed sizes
# (stated: a method without :mode= is cost-aware in runs recorded since that is the
# default); the time prediction replays them as they were recorded.
EXACT_REPLAY_METHODS = "pld:mode=fixed,llma:mode=fixed"
PREDICT_REPLAY_METHODS = "pld,llma"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench", help="benchmark suites, acceptance replay and runtime benchmarks",
        description="Without a sub-command: run a benchmark suite (needs --suite).",
    )
    p.add_argument("--suite", help="spec_bench, mt_bench, humaneval, mbpp, gsm8k, cnndm, "
                                    "rag_extractive (or rag-extractive) or demo")
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help="comma-separated: ar, drafter specs (pld, llma, sam:index=x.rsidx, ...: "
                        "cost-aware sizing unless :mode=fixed), hf-greedy, hf-pld, "
                        "llamacpp-greedy, llamacpp-ngram-simple / -ngram-mod / -ngram-map-k / "
                        "-ngram-map-k4v / -ngram-cache (native llama.cpp: make peers) "
                        f"(default {DEFAULT_METHODS})")
    p.add_argument("--model", default=None, help="GGUF file, HF directory or alias")
    p.add_argument("--limit", type=int, default=None, help="first N questions (after subsetting)")
    p.add_argument("--per-category", type=int, default=None,
                   help="fixed stratified subset: N evenly spaced questions per category")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1, help="time each question R times (median)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--dtype", default=DEFAULT_WEIGHT_FORMAT, choices=WEIGHT_FORMATS,
                   help="weights: auto = a GGUF's own blocks (quantized kernel), float32 = "
                        "the dequantized reference")
    p.add_argument("--max-draft-nodes", type=int, default=MAX_DRAFT_NODES)
    p.add_argument("--out", default="bench_out", help="output directory (default bench_out)")
    p.add_argument("--resume", action="store_true", help="skip questions already answered")
    p.add_argument("--overwrite", action="store_true", help="discard existing answers in --out")
    p.add_argument("--data-dir", default=None, help="benchmark data (default: ../shared/data)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.set_defaults(handler=run_suite, bench_parser=p)

    bsub = p.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
    rp = bsub.add_parser("report", help="re-render report.json/.md/plots of a run directory")
    rp.add_argument("--out", required=True)
    rp.set_defaults(handler=run_report)

    pl = bsub.add_parser("replay", help="exact offline acceptance replay on recorded ar answers")
    pl.add_argument("--answers", required=True, help="an ar answer file (DIR/answers/ar.jsonl)")
    pl.add_argument("--methods", default=None,
                    help="model-free drafters to replay. Exact replay replays fixed sizes "
                    "only (there is no time to size by): name them NAME:mode=fixed (default "
                    f"{EXACT_REPLAY_METHODS}); with --predict-time (default "
                    f"{PREDICT_REPLAY_METHODS}) a method without :mode= is sized as it was "
                    "where --answers was recorded (cost-aware; fixed in runs recorded before "
                    "that was the default)")
    pl.add_argument("--model", default=None,
                    help="whose tokenizer a corpus index must match (default: the recorded "
                    "run's model)")
    pl.add_argument("--max-draft-nodes", type=int, default=None,
                    help=f"default: the recorded run's setting, else {MAX_DRAFT_NODES}")
    pl.add_argument("--max-new-tokens", type=int, default=None,
                    help="default: the recorded run's setting")
    pl.add_argument("--max-len", type=int, default=4096, help="KV positions per sequence")
    pl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pl.add_argument("--predict-time", action="store_true",
                    help="also predict tokens/s from the cost curve (methods are then sized as "
                         "the engine sizes them: cost-aware unless NAME:mode=fixed; also "
                         "oracle:drafters=a+b and ar); compared with the answers recorded "
                         "next to --answers where there are some")
    pl.add_argument("--curve", default=None,
                    help="cost curve JSON (default: this machine's cached curve of the "
                         "recorded model, measured if missing)")
    pl.add_argument("--model-topk", action="store_true",
                    help="replay drafters that learn from verification logits (recycling) "
                         "with the recorded model's top-k along the answers (one forward "
                         "per turn, cached; rejected nodes' rows stay unknown)")
    pl.add_argument("--fit-rows-on", default="auto",
                    help="where the time model's per-draft-row term comes from: auto (each "
                         "method's from the OTHER listed drafting methods' recorded runs), a "
                         "recorded method's name (that run alone), or none")
    pl.add_argument("--no-policy-time", action="store_true",
                    help="leave the policies' measured Python time out of the prediction")
    pl.add_argument("--out", default=None, help="also write the prediction (JSON) here")
    pl.set_defaults(handler=run_replay)

    rt = bsub.add_parser("runtime", help="AR tokens/s vs transformers, verification cost curve, "
                                         "memory-bandwidth fraction")
    rt.add_argument("--model", default=None)
    rt.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    rt.add_argument("--out", default=None, help="also write runtime.json/.md/.png here")
    rt.add_argument("--repeats", type=int, default=5)
    rt.add_argument("--new-tokens", type=int, default=128)
    rt.add_argument("--dtypes", default="quantized,float32",
                    help="our weight formats to time: quantized, float32, bfloat16")
    rt.add_argument("--no-llamacpp", action="store_true",
                    help="skip native llama.cpp (otherwise run when `make peers` built it)")
    rt.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    rt.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    rt.set_defaults(handler=run_runtime)

    for name in _EXTRA_SUBCOMMAND_MODULES:
        importlib.import_module(name).register_bench(bsub)


def csv_list(s: str | None) -> tuple[str, ...] | None:
    """The items of a comma-separated option (None: not given); the sub-command modules
    share it."""
    if s is None:
        return None
    items = tuple(x.strip() for x in s.split(",") if x.strip())
    if not items:
        raise DataError("empty comma-separated list")
    return items


def config_from_args(cls: type[Settings], args: argparse.Namespace, **given: Any) -> Settings:
    """``cls`` (a bench's settings, a dataclass) with every field taken from the option of
    the same name (``--max-tokens``: ``max_tokens``), except those in ``given`` (options
    that need parsing or another name); a field no option names keeps its default. The
    sub-command modules share it, so an option added to both sides needs no third edit."""
    names = {f.name for f in dataclasses.fields(cls)} - given.keys()
    return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)}, **given)


def run_suite(args: argparse.Namespace) -> int:
    from recallspec.bench.report import render_markdown, write_report
    from recallspec.bench.runner import BenchConfig, run_bench
    from recallspec.bench.suites import SuiteSelection

    if not args.suite:
        args.bench_parser.error("--suite is required (or give a sub-command)")
    if args.resume and args.overwrite:
        raise DataError("--resume and --overwrite exclude each other")
    if args.threads is not None:
        import torch

        if args.threads < 1:
            raise DataError("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    cfg = BenchConfig(
        suite=args.suite, methods=csv_list(args.methods) or (), model=args.model,
        selection=SuiteSelection(args.per_category, args.limit, csv_list(args.categories)),
        max_new_tokens=args.max_new_tokens, repeats=args.repeats,
        temperature=args.temperature, max_draft_nodes=args.max_draft_nodes, dtype=args.dtype,
        data_dir=args.data_dir,
    )
    out = Path(args.out)
    run_bench(cfg, out, resume=args.resume, overwrite=args.overwrite,
              progress=not args.no_progress)
    rep = write_report(out)
    print_report(render_markdown(rep), rep["machine"],
                 f"answers, report.json, report.md and plots in {out}")
    return 0


def run_report(args: argparse.Namespace) -> int:
    from recallspec.bench.report import render_markdown, write_report

    out = Path(args.out)
    if not (out / "answers").is_dir():
        raise DataError(f"{out} has no answers/ directory")
    print(render_markdown(write_report(out)))
    return 0


def run_replay(args: argparse.Namespace) -> int:
    from recallspec.bench.methods import method_spec, recorded_sizing_default
    from recallspec.bench.replay import (
        ReplayConfig,
        load_ar_answers,
        render_replay_markdown,
        replay_answers,
        replay_report,
    )

    recs, settings = load_ar_answers(Path(args.answers))
    mnt = args.max_new_tokens or settings.get("max_new_tokens")
    if mnt is None:
        raise DataError("the answers' run.json is missing: pass --max-new-tokens")
    cfg = ReplayConfig(
        max_new_tokens=int(mnt),
        max_draft_nodes=int(args.max_draft_nodes or settings.get("max_draft_nodes")
                            or MAX_DRAFT_NODES),
        max_len=args.max_len,
        # A method named without a sizing means what it meant where the answers were
        # recorded (cost-aware; fixed in runs recorded before that was the default).
        sizing_default=recorded_sizing_default(settings),
    )
    methods = csv_list(args.methods or (PREDICT_REPLAY_METHODS if args.predict_time
                                        else EXACT_REPLAY_METHODS)) or ()
    if args.predict_time:
        return _predict(args, recs, settings, cfg, methods)

    replayed = {}
    fingerprint: str | None = None
    for m in methods:
        spec = method_spec(m, cfg.sizing_default)
        # Exact replay has no time to size by: it replays the drafts at fixed sizes only;
        # cost-aware sizing, stated or an unlabeled method's default, is --predict-time's.
        if spec.sizing == "adaptive":
            why = ("its :mode=adaptive" if method_spec(m).sizing else
                   f"a method without :mode= is, in {Path(args.answers).parent.parent}")
            raise DataError(f"{m}: exact replay replays fixed draft sizes only; cost-aware "
                            f"sizing ({why}) follows timing, which exact replay does not "
                            f"have: name it {replace(spec, sizing='fixed')}, or use "
                            "--predict-time")
        opts = spec.kwargs
        if "index" in opts and "tokenizer_fingerprint" not in opts:
            # No engine here: the recorded model's tokenizer is what the index must match.
            if fingerprint is None:
                from recallspec.models import load_tokenizer

                fingerprint = load_tokenizer(args.model or settings.get("model")).fingerprint
            opts["tokenizer_fingerprint"] = fingerprint
        replayed[m] = replay_answers(recs, spec.name, cfg, opts)
    rep = replay_report(recs, replayed)
    if args.json:
        print(json.dumps({"config": cfg.__dict__, "mat": rep}, indent=2))
    else:
        print(render_replay_markdown(rep))
    return 0


def _predict(args: argparse.Namespace, recs: list[dict[str, Any]], settings: dict[str, Any],
             cfg: Any, methods: tuple[str, ...]) -> int:
    """``bench replay --predict-time``: see ``bench/replay_time.py``."""
    from recallspec.bench.replay_time import predict_methods, render_prediction_markdown
    from recallspec.runtime.cost_curve import CostCurve

    engine: Any = None
    if not args.curve or args.model_topk:
        from recallspec.engine import Engine

        engine = Engine.load(args.model or settings.get("model"),
                             dtype=settings.get("dtype", "auto"))
    if args.curve:
        curve = CostCurve.from_json(json.loads(Path(args.curve).read_text(encoding="utf-8")))
    else:
        curve = engine.cost_curve()
    topk, vocab = None, 0
    if args.model_topk:
        from recallspec.bench.replay_logits import cached_answer_topk
        from recallspec.models.loader import cache_dir
        from recallspec.runtime.curve_cache import curve_key

        key = curve_key(engine.model, getattr(engine.tokenizer, "fingerprint", ""), 1)
        topk = cached_answer_topk(engine.model, recs, Path(args.answers), key, cache_dir())
        vocab = int(engine.model.config.vocab_size)
    fit, pred, real = predict_methods(
        recs, cfg, curve, methods, Path(args.answers).parent.parent,
        count_policy_time=not args.no_policy_time, topk=topk, vocab=vocab,
        row_fit=None if args.fit_rows_on == "none" else args.fit_rows_on,
        warn=lambda msg: print(msg, file=sys.stderr))
    res = {"config": cfg.__dict__, "fit": fit, "predicted": pred, "recorded": real}
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2), encoding="utf-8")
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        rows = fit["row_overhead_ms"]
        print(f"time model (fitted on the ar run's {fit['source']}): forwards "
              f"x{fit['forward_scale']:.3f} and prefill x{fit['prefill_scale']:.3f} the "
              f"curve's, {fit['step_overhead_ms']:.3f} ms a step, "
              f"{fit['turn_overhead_ms']:.1f} ms a turn, {fit['prompt_overhead_ms']:.3f} ms "
              f"a prompt token ({fit['turns']:.0f} turns; {fit['disturbed']:.0f} took 25% "
              "longer than the model: another job?); ms a draft row "
              + ("(fitted on the other methods' runs)" if fit["row_fit"] == "auto"
                 else f"(fitted on {fit['row_fit']})") + ": "
              + (", ".join(f"{m} {v:.3f}" for m, v in rows.items()) or "none") + "\n")
        fitted = fit["row_fit"] if fit["row_fit"] not in (None, "auto") else None
        print(render_prediction_markdown(pred, real, fitted=fitted))
    return 0


def run_runtime(args: argparse.Namespace) -> int:
    from recallspec.bench.runtime import RuntimeConfig, render_runtime_markdown, run_runtime_bench

    cfg = RuntimeConfig(
        model=args.model, repeats=args.repeats, new_tokens=args.new_tokens,
        dtypes=csv_list(args.dtypes) or (), hf=not args.no_hf, threads=args.threads,
        llamacpp=not args.no_llamacpp,
    )
    res = run_runtime_bench(cfg, out=Path(args.out) if args.out else None)
    print(json.dumps(res, indent=2) if args.json else render_runtime_markdown(res))
    return 0


def print_report(markdown: str, machine: dict[str, Any], written: str) -> None:
    """A run's report on stdout; a busy-machine warning and where the files are on stderr."""
    from recallspec.bench.report import busy_warning

    print(markdown)
    warn = busy_warning(machine)
    if warn:
        print(warn, file=sys.stderr)
    print(written, file=sys.stderr)
