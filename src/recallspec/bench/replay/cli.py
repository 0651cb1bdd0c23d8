"""`recallspec bench replay`: exact offline acceptance replay of recorded ``ar`` answers,
and (``--predict-time``) the time prediction built on it.

    recallspec bench replay --answers DIR/answers/ar.jsonl --methods pld:mode=fixed,llma:mode=fixed
    recallspec bench replay --answers ... --methods ar,llma:mode=fixed,portfolio,oracle \
        --predict-time [--curve FILE] [--model-topk] [--out FILE]
    recallspec bench replay --foreign-answers mt_bench/model_answer/vicuna-7b.jsonl \
        [--questions mt_bench/question.jsonl] --methods ar,pld,llma --predict-time --curve FILE

See ``bench/replay/exact.py``, ``bench/replay/predict.py`` and, for another model's
answers, ``bench/replay/foreign.py``; the handler imports them (and, for the prediction,
the engine) when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from recallspec.bench.common.args import csv_list
from recallspec.errors import DataError
from recallspec.params import MAX_DRAFT_NODES

# `bench replay`'s methods: exact replay has no time to size by, so it replays fixed sizes
# (stated: a method without :mode= is cost-aware in runs recorded since that is the
# default); the time prediction replays them as they were recorded.
EXACT_REPLAY_METHODS = "pld:mode=fixed,llma:mode=fixed"
PREDICT_REPLAY_METHODS = "pld,llma"


def register(bsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pl = bsub.add_parser("replay", help="exact offline acceptance replay on recorded ar answers")
    source = pl.add_mutually_exclusive_group(required=True)
    source.add_argument("--answers", help="an ar answer file (DIR/answers/ar.jsonl)")
    source.add_argument("--foreign-answers", metavar="FILE",
                        help="another model's answers (FastChat MT-Bench answer file: "
                        "question_id, model_id, choices[0].turns), retokenized with --model's "
                        "tokenizer into our prompt encoding; model-free drafters only, "
                        "--predict-time priced by the curve alone")
    pl.add_argument("--questions", metavar="FILE", default=None,
                    help="--foreign-answers' question file (default: question.jsonl in the "
                    "folder above the answers' folder, as FastChat's data/mt_bench/)")
    pl.add_argument("--methods", default=None,
                    help="model-free drafters to replay. Exact replay replays fixed sizes "
                    "only (there is no time to size by): name them NAME:mode=fixed (default "
                    f"{EXACT_REPLAY_METHODS}); with --predict-time (default "
                    f"{PREDICT_REPLAY_METHODS}) a method without :mode= is sized as it was "
                    "where --answers was recorded (cost-aware; fixed in runs recorded before "
                    "that was the default)")
    pl.add_argument("--model", default=None,
                    help="whose tokenizer a corpus index must match and --foreign-answers "
                    "are retokenized with (default: the recorded run's model; with "
                    "--foreign-answers the default model)")
    pl.add_argument("--max-draft-nodes", type=int, default=None,
                    help=f"default: the recorded run's setting, else {MAX_DRAFT_NODES}")
    pl.add_argument("--max-new-tokens", type=int, default=None,
                    help="default: the recorded run's setting (--foreign-answers: each "
                    "answer cut to this many tokens; default whole)")
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


def run_replay(args: argparse.Namespace) -> int:
    from recallspec.bench.common.method import method_spec, recorded_sizing_default
    from recallspec.bench.replay.exact import (
        ReplayConfig,
        load_ar_answers,
        render_replay_markdown,
        replay_answers,
        replay_report,
    )

    methods = csv_list(args.methods or (PREDICT_REPLAY_METHODS if args.predict_time
                                        else EXACT_REPLAY_METHODS)) or ()
    if args.foreign_answers:
        recs, settings = _load_foreign(args, methods)
        where = "by today's default, for another model's answers"
    else:
        if args.questions:
            raise DataError("--questions goes with --foreign-answers")
        recs, settings = load_ar_answers(Path(args.answers))
        where = f"in {Path(args.answers).parent.parent}"
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
                   f"a method without :mode= is, {where}")
            raise DataError(f"{m}: exact replay replays fixed draft sizes only; cost-aware "
                            f"sizing ({why}) follows timing, which exact replay does not "
                            f"have: name it {replace(spec, sizing='fixed')}, or use "
                            "--predict-time")
        opts = spec.kwargs
        if "index" in opts and "tokenizer_fingerprint" not in opts:
            # No engine here: the recorded model's tokenizer is what the index must match.
            fingerprint = fingerprint or settings.get("tokenizer_fingerprint")
            if fingerprint is None:
                from recallspec.models import load_tokenizer

                fingerprint = load_tokenizer(args.model or settings.get("model")).fingerprint
            opts["tokenizer_fingerprint"] = fingerprint
        replayed[m] = replay_answers(recs, spec.name, cfg, opts)
    rep = replay_report(recs, replayed)
    if args.json:
        print(json.dumps({"config": cfg.__dict__, "mat": rep, **_foreign_source(settings)},
                         indent=2))
    else:
        _print_foreign_source(settings)
        print(render_replay_markdown(rep))
    return 0


def _load_foreign(
    args: argparse.Namespace, methods: tuple[str, ...],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``--foreign-answers``' records and settings (``bench/replay/foreign.py``), after
    refusing what needs the model before any work."""
    from recallspec.bench.replay.foreign import (
        ForeignSource,
        default_questions,
        load_foreign_answers,
        refuse_model_drafters,
        refuse_row_fit,
    )

    answers = Path(args.foreign_answers)
    if args.model_topk:
        raise DataError(f"--model-topk: another model's answers ({answers}) come without "
                        "its logits")
    refuse_row_fit(None if args.fit_rows_on == "none" else args.fit_rows_on)
    refuse_model_drafters(methods, answers)
    questions = Path(args.questions) if args.questions else default_questions(answers)
    if questions is None:
        raise DataError(f"no question file beside {answers} (looked for "
                        f"{answers.parent.parent / 'question.jsonl'}): pass --questions")
    from recallspec.models import load_tokenizer

    src = ForeignSource(answers, questions, args.model, args.max_new_tokens, args.max_len)
    return load_foreign_answers(src, load_tokenizer(args.model))


def _foreign_source(settings: dict[str, Any]) -> dict[str, Any]:
    """{"foreign": settings} for another model's answers, else {} (the JSON reports)."""
    return {"foreign": settings} if "foreign_answers" in settings else {}


def _print_foreign_source(settings: dict[str, Any]) -> None:
    if "foreign_answers" not in settings:
        return
    cut = settings["cut_turns"]
    print(f"answers of {settings['foreign_model'] or 'another model'} "
          f"({settings['foreign_answers']}), retokenized with {settings['retokenized_with']}"
          + (f"; {cut} turns cut at {settings['max_new_tokens']} tokens" if cut else "")
          + "\n")


def _predict(args: argparse.Namespace, recs: list[dict[str, Any]], settings: dict[str, Any],
             cfg: Any, methods: tuple[str, ...]) -> int:
    """``bench replay --predict-time``: see ``bench/replay/predict.py``."""
    from recallspec.bench.replay.predict import predict_methods, render_prediction_markdown
    from recallspec.cost.curve import CostCurve

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
        from recallspec.bench.replay.logits import cached_answer_topk
        from recallspec.cost.cache import curve_key
        from recallspec.models.loader import cache_dir

        key = curve_key(engine.model, getattr(engine.tokenizer, "fingerprint", ""), 1)
        topk = cached_answer_topk(engine.model, recs, Path(args.answers), key, cache_dir())
        vocab = int(engine.model.config.vocab_size)
    foreign = "foreign_answers" in settings
    fit, pred, real = predict_methods(
        recs, cfg, curve, methods, None if foreign else Path(args.answers).parent.parent,
        count_policy_time=not args.no_policy_time, topk=topk, vocab=vocab,
        row_fit=None if args.fit_rows_on == "none" else args.fit_rows_on,
        warn=lambda msg: print(msg, file=sys.stderr))
    res = {"config": cfg.__dict__, "fit": fit, "predicted": pred, "recorded": real,
           **_foreign_source(settings)}
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2), encoding="utf-8")
    if args.json:
        print(json.dumps(res, indent=2))
    elif foreign:
        _print_foreign_source(settings)
        print(render_prediction_markdown(pred, real, curve_only=True))
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
