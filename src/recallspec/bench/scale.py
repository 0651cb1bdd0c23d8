"""`recallspec bench scale`: ours and native llama.cpp at the model shapes people run.

For each (shape, quantization) of the matrix, in one run on one machine:

* the GGUF: random weights at a published shape (``bench/shapes.py``), quantized by
  llama.cpp's own ``llama-quantize``, cached; speed is data-independent in both engines;
* ours (a child process per model, ``bench/scale_ours.py``): AR decode tok/s, prefill
  tok/s, the verification cost curve (k rows on ``cached`` tokens), resident memory,
  load time, achieved GB/s against the streaming read bandwidth measured in the run;
* native llama.cpp (``bench/llamacpp.py``): ``llama-bench`` tg and pp, and
  ``llama-server``'s verification curve (its timed prompt eval of k tokens on top of
  ``cached`` tokens already in its cache: logits of the last row only, so it slightly
  under-prices a verification that needs every row's), its resident memory and start;
* paired decode and prefill rounds (``decode_rounds``, ``prefill_rounds``): ours (a
  fresh child, decode or prefill only) and llama-bench's tg or pp, back to back, the
  order alternating by round, each after an idle pause; the median of the rounds'
  ratios is the ratio least moved by a shared VM's drift (its speed changed 1.5-2x
  within one run here, and the sequential measurements above put the two engines
  minutes apart);
* time to first token (``ttft_repeats``, ``bench/cold_start.py``): ours from a fresh
  process on the first run (conversion and repack) and on a later run (the repack cache
  read), and llama-server's from its process start, each process after a pause;
* with ``answers`` (a ``recallspec bench`` run of SmolLM2 on Spec-Bench with ``ar`` and
  the drafting methods): the predicted Spec-Bench tokens/s of our methods at the shape
  (``bench/scale_predict.py``), labelled as a prediction, with the replay's error on the
  real run beside it.

Results go to ``OUT/scale.json`` after every entry (an interrupted run resumes where it
stopped), ``scale.md`` and ``scale.png`` (``bench/scale_report.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recallspec.errors import DataError

SHAPES_Q4KM = ("smollm2-360m", "qwen2.5-1.5b", "smollm2-1.7b", "llama-3.2-1b",
               "llama-3.2-3b", "smollm3-3b", "phi-4-mini", "gemma-3-4b", "qwen3-4b",
               "llama-3.1-8b")
# Every shape at Q4_K_M (what most downloads are), two of them also at Q4_0 and Q8_0.
DEFAULT_MATRIX: tuple[tuple[str, str], ...] = (
    *((s, "Q4_K_M") for s in SHAPES_Q4KM),
    ("smollm2-1.7b", "Q4_0"), ("smollm2-1.7b", "Q8_0"),
    ("llama-3.1-8b", "Q4_0"), ("llama-3.1-8b", "Q8_0"),
)
PREDICT_METHODS = ("ar", "pld", "llma", "sam+recycling:mode=adaptive", "portfolio:mode=adaptive")


@dataclass(frozen=True)
class ScaleConfig:
    entries: tuple[tuple[str, str], ...] = DEFAULT_MATRIX  # (shape, quantization)
    repeats: int = 3
    new_tokens: int = 128  # decode: tokens generated
    prefill: int = 512  # prefill: prompt tokens
    ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32)  # verification rows
    cached: int = 512  # tokens in the KV cache under the verification curve
    threads: int | None = None  # both engines (default: torch's, i.e. every core)
    llamacpp: bool = True
    answers: str | None = None  # a `recallspec bench` output directory (SmolLM2, Spec-Bench)
    methods: tuple[str, ...] = PREDICT_METHODS
    stream_mib: int = 1024
    overwrite: bool = False  # measure entries already in OUT/scale.json again
    decode_rounds: int = 3  # paired decode rounds (with llamacpp; 0: none)
    prefill_rounds: int = 3  # paired prefill rounds (with llamacpp; 0: none)
    pair_idle_s: float = 5.0  # idle before each side of a paired round
    ttft_repeats: int = 1  # time to first token from fresh processes (0: not measured)

    def __post_init__(self) -> None:
        from recallspec.bench.shapes import QUANTS, SHAPES

        if not self.entries:
            raise DataError("bench scale: no (shape, quantization) to measure")
        for shape, quant in self.entries:
            if shape not in SHAPES:
                raise DataError(f"unknown shape {shape!r} (known: {', '.join(SHAPES)})")
            if quant not in QUANTS:
                raise DataError(f"unknown quantization {quant!r} (known: {', '.join(QUANTS)})")
        if self.repeats < 1 or self.new_tokens < 2 or self.prefill < 1 or self.cached < 1:
            raise DataError("need repeats >= 1, new_tokens >= 2, prefill >= 1, cached >= 1")
        if not self.ks or min(self.ks) < 1 or 1 not in self.ks:
            raise DataError(f"ks must be positive and include 1 (the ratios' base): {self.ks}")
        if self.decode_rounds < 0 or self.prefill_rounds < 0:
            raise DataError("decode_rounds and prefill_rounds must be >= 0, got "
                            f"{self.decode_rounds} and {self.prefill_rounds}")
        if self.pair_idle_s < 0:
            raise DataError(f"pair_idle_s must be >= 0, got {self.pair_idle_s}")
        if self.ttft_repeats < 0:
            raise DataError(f"ttft_repeats must be >= 0, got {self.ttft_repeats}")
        if self.answers is not None and "ar" not in self.methods:
            raise DataError("the predicted speedups need 'ar' among the methods")


def positive_ints(s: str) -> tuple[int, ...]:
    """``1,2,4``: the comma-separated positive integers of ``--ks`` and ``--contexts``, as
    an argparse ``type`` (``recallspec bench scale`` and its child ``bench/scale_ours.py``
    parse the same format, which ``_ours`` writes)."""
    try:
        vals = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {s!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"need positive integers: {s!r}")
    return vals


def parse_entries(shapes: str | None, quants: str | None) -> tuple[tuple[str, str], ...]:
    """``--shapes a,b --quants Q4_K_M,Q8_0``: their product; neither: the default matrix;
    only ``--quants``: every shape at those; only ``--shapes``: those at Q4_K_M."""
    if not shapes and not quants:
        return DEFAULT_MATRIX
    ss = [s.strip() for s in (shapes or ",".join(SHAPES_Q4KM)).split(",") if s.strip()]
    qs = [q.strip() for q in (quants or "Q4_K_M").split(",") if q.strip()]
    return tuple((s, q) for s in ss for q in qs)


def _ours(gguf: Path, cfg: ScaleConfig, curve_out: Path | None, say: Callable[[str], None],
          only: str | None = None, repeats: int | None = None) -> dict[str, Any]:
    """Our child's measurements: everything, with the curve written to ``curve_out``; or
    ``only`` "decode" or "prefill" (a paired round's side), medians of ``repeats``
    (default ``cfg.repeats``)."""
    if (only is None) == (curve_out is None):
        raise ValueError("_ours measures everything (curve_out) or one side (only), not both")
    cmd = [sys.executable, "-m", "recallspec.bench.scale_ours", str(gguf),
           "--repeats", str(repeats or cfg.repeats),
           "--new-tokens", str(cfg.new_tokens),
           "--prefill", str(cfg.prefill), "--ks", ",".join(map(str, cfg.ks)),
           "--cached", str(cfg.cached)]
    cmd += ["--only", only] if only else ["--curve-out", str(curve_out)]
    if cfg.threads:
        cmd += ["--threads", str(cfg.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        say(f"  ours failed (exit {proc.returncode}): {tail}")
        return {"error": f"exit {proc.returncode}: {tail}"}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def paired_rounds(gguf: Path, cfg: ScaleConfig, threads: int, measure: str, rounds: int,
                  say: Callable[[str], None], repeats: int = 1) -> list[dict[str, Any]]:
    """``rounds`` rounds of {"ours", "llamacpp": tok/s, "first": which ran first}: ours in a
    fresh child and llama-bench, back to back, the order alternating by round, each after
    ``cfg.pair_idle_s`` idle. ``measure``: "decode" (``new_tokens``: AR decode and tg) or
    "prefill" (``prefill`` tokens: one prefill forward and pp), each side the median of
    ``repeats`` after its warm-up (once by default: the rounds' median is the estimate,
    and an 8B pp512 of llama.cpp takes over a minute on two cores). A round whose either
    half failed is left out (and said)."""
    from recallspec.bench import llamacpp as lc
    from recallspec.bench.scale_llamacpp import one_rate

    if measure not in ("decode", "prefill"):
        raise ValueError(f"measure must be 'decode' or 'prefill', got {measure!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    tokens = cfg.new_tokens if measure == "decode" else cfg.prefill
    done = []
    for r in range(rounds):
        first = "ours" if r % 2 == 0 else "llamacpp"
        got: dict[str, Any] = {"first": first}
        for side in (first, "llamacpp" if first == "ours" else "ours"):
            # Memory the other side freed faults back slowly on a VM: an idle pause first.
            time.sleep(cfg.pair_idle_s)
            if side == "ours":
                o = _ours(gguf, cfg, None, say, only=measure, repeats=repeats)
                got["ours"] = (o.get("ar", {}).get("decode_tok_s") if measure == "decode"
                               else o.get("prefill_tok_s"))
            else:
                try:
                    got["llamacpp"] = one_rate(gguf, threads, measure, tokens, repeats)
                except (lc.LlamaCppError, lc.PeerNotBuilt) as e:
                    say(f"  llama.cpp failed: {e}")
        if got.get("ours") and got.get("llamacpp"):
            done.append(got)
            say(f"  {measure} round {r + 1}: ours {got['ours']:.2f}, llama.cpp "
                f"{got['llamacpp']:.2f} tok/s ({got['ours'] / got['llamacpp']:.2f}x)")
    return done


def paired_summary(rounds: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """{"median", "min", "max", "rounds"} of the rounds' ours / llama.cpp; None for none."""
    ratios = [r["ours"] / r["llamacpp"] for r in rounds]
    if not ratios:
        return None
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "rounds": len(ratios)}


def _ttft(gguf: Path, cfg: ScaleConfig, threads: int, out: Path,
          say: Callable[[str], None]) -> dict[str, Any]:
    """``bench/cold_start.py``'s figures for one model, or {"error": ...}."""
    from recallspec.bench import llamacpp as lc
    from recallspec.bench.cold_start import ColdStartConfig, measure

    try:
        return measure(gguf, ColdStartConfig(threads=threads, repeats=cfg.ttft_repeats,
                                             peer=cfg.llamacpp), scratch=out, say=say)
    except (DataError, lc.LlamaCppError) as e:  # (PeerNotBuilt is a DataError) the run goes on
        say(f"  time to first token failed: {e}")
        return {"error": str(e)}


def _derive(entry: dict[str, Any], stream: dict[str, float]) -> None:
    """Ratios of one entry: ours over llama.cpp, k over k = 1, GB/s over the stream."""
    ours, lc = entry.get("ours", {}), entry.get("llamacpp", {})
    d: dict[str, Any] = {}
    if "ar" in ours:
        d["bandwidth_fraction"] = ours["achieved_gb_s"] / stream["read_gb_s"]
        d["cost_ratio"] = {k: v / ours["cost_ms"]["1"] for k, v in ours["cost_ms"].items()}
        d["rss_vs_file"] = ours["rss_mb"] / (entry["file_bytes"] / 1e6)
    if "ar" in ours and lc.get("tg_tok_s"):
        d["decode_vs_llamacpp"] = ours["ar"]["decode_tok_s"] / lc["tg_tok_s"]
    if ours.get("prefill_tok_s") and lc.get("pp_tok_s"):
        d["prefill_vs_llamacpp"] = ours["prefill_tok_s"] / lc["pp_tok_s"]
    if lc.get("cost_ms", {}).get("1"):
        d["llamacpp_cost_ratio"] = {k: v / lc["cost_ms"]["1"] for k, v in lc["cost_ms"].items()}
    if lc.get("tg_tok_s"):
        d["llamacpp_gb_s"] = entry["file_bytes"] * lc["tg_tok_s"] / 1e9  # ~ bytes read a token
    for measure in ("decode", "prefill"):
        summary = paired_summary(entry.get(f"paired_{measure}", []))
        if summary:
            d[f"{measure}_vs_llamacpp_paired"] = summary
    entry["derived"] = d


def write_scale(res: dict[str, Any], out: Path) -> None:
    """scale.json, scale.md and scale.png in ``out``."""
    from recallspec.bench.scale_report import plot_scale, render_scale_markdown

    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "scale.json.tmp"
    tmp.write_text(json.dumps(res, indent=2), encoding="utf-8")
    tmp.replace(out / "scale.json")
    (out / "scale.md").write_text(render_scale_markdown(res), encoding="utf-8")
    plot_scale(res, out / "scale.png")


def add_predictions(res: dict[str, Any], answers_dir: str | Path, methods: Sequence[str],
                    threads: int | None, say: Callable[[str], None]) -> None:
    """``res["prediction"]``: the Spec-Bench answers in ``answers_dir`` (a ``recallspec
    bench`` run of SmolLM2 with ar and the drafting ``methods``) replayed with each entry's
    measured curve (``curve_file``), the time model fitted on that run
    (``bench/scale_predict.py``); also for a table measured before
    (``scripts/exp_repredict.py``)."""
    from recallspec.bench.methods import recorded_sizing_default
    from recallspec.bench.replay import ReplayConfig, load_ar_answers
    from recallspec.bench.scale_predict import fitted_model, predict_at_curve
    from recallspec.engine import Engine
    from recallspec.params import MAX_DRAFT_NODES
    from recallspec.runtime.cost_curve import CostCurve

    answers = Path(answers_dir) / "answers" / "ar.jsonl"
    recs, settings = load_ar_answers(answers)
    rc = ReplayConfig(max_new_tokens=int(settings.get("max_new_tokens") or 128),
                      max_draft_nodes=int(settings.get("max_draft_nodes") or MAX_DRAFT_NODES),
                      # an unlabeled method (pld) as sized where its answers were recorded
                      sizing_default=recorded_sizing_default(settings))
    say(f"prediction: fitting the time model on {answers} ({len(recs)} questions)")
    engine = Engine.load(settings.get("model"), dtype=settings.get("dtype", "auto"),
                         threads=threads)
    fit, check = fitted_model(recs, rc, engine.cost_curve(), methods, answers.parent.parent,
                              lambda m: say(f"  {m}"))
    del engine
    res["prediction"] = {"answers": str(answers), "questions": len(recs),
                         "model": settings.get("model") or "default (SmolLM2-135M)",
                         "fit": fit, "replay_error_on_real_run": check, "entries": {}}
    for key, entry in res["entries"].items():
        path = entry.get("curve_file")
        if not path or not Path(path).is_file():
            continue
        say(f"prediction at {key}")
        curve = CostCurve.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
        res["prediction"]["entries"][key] = predict_at_curve(recs, rc, curve, methods, fit)


def run_scale(cfg: ScaleConfig, out: Path,
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    from recallspec.bench.report import _machine, busy_warning
    from recallspec.bench.runtime import stream_bandwidth
    from recallspec.bench.scale_llamacpp import llamacpp_side, peer_description
    from recallspec.bench.shapes import ensure_shape_gguf

    say = log or (lambda m: print(m, flush=True, file=sys.stderr))
    path = out / "scale.json"
    res: dict[str, Any] = {}
    if path.is_file():  # (--overwrite measures the asked entries again, keeps the rest)
        res = json.loads(path.read_text(encoding="utf-8"))
        say(f"resuming {path}: {len(res.get('entries', {}))} entries already measured")
    res.setdefault("entries", {})
    res["config"] = asdict(cfg)
    res["machine"] = _machine()
    res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    warn = busy_warning(res["machine"])
    if warn:
        say(warn)
    if cfg.llamacpp:
        res["peer"] = peer_description()
    say(f"streaming read bandwidth over {cfg.stream_mib} MiB")
    res["stream"] = stream_bandwidth(cfg.stream_mib, cfg.repeats)
    for shape, quant in cfg.entries:
        key = f"{shape}:{quant}"
        if key in res["entries"] and not cfg.overwrite and "error" not in res["entries"][key]:
            continue
        say(f"[{key}] model file")
        gguf = ensure_shape_gguf(shape, quant, progress=say)
        entry: dict[str, Any] = {"shape": shape, "quant": quant, "gguf": str(gguf),
                                 "file_bytes": gguf.stat().st_size,
                                 "loadavg_1m_before": _machine()["loadavg_1m"],
                                 "stream": res["stream"]}
        curve_file = out / "curves" / f"{shape}-{quant}.json"
        curve_file.parent.mkdir(parents=True, exist_ok=True)
        mb = entry["file_bytes"] / 1e6
        say(f"[{key}] ours: decode, prefill, verification curve ({mb:,.0f} MB file)")
        entry["ours"] = _ours(gguf, cfg, curve_file, say)
        if "error" not in entry["ours"]:
            entry["curve_file"] = str(curve_file)
        if cfg.llamacpp:
            say(f"[{key}] llama.cpp: llama-bench tg/pp, llama-server verification curve")
            entry["llamacpp"] = llamacpp_side(gguf, cfg, entry["ours"].get("threads"), say)
            if entry["llamacpp"].get("system_info"):
                res["peer"]["system_info"] = entry["llamacpp"]["system_info"]
            for measure, rounds in (("decode", cfg.decode_rounds),
                                    ("prefill", cfg.prefill_rounds)):
                if rounds and "error" not in entry["ours"]:
                    say(f"[{key}] paired {measure}: {rounds} rounds")
                    entry[f"paired_{measure}"] = paired_rounds(
                        gguf, cfg, entry["ours"]["threads"], measure, rounds, say)
        if cfg.ttft_repeats and "error" not in entry["ours"]:
            say(f"[{key}] time to first token: ours first and later run, llama-server")
            entry["ttft"] = _ttft(gguf, cfg, entry["ours"]["threads"], out, say)
        _derive(entry, entry["stream"])
        res["entries"][key] = entry
        write_scale(res, out)
    res["stream_after"] = stream_bandwidth(cfg.stream_mib, cfg.repeats)
    if cfg.answers:
        add_predictions(res, cfg.answers, cfg.methods, cfg.threads, say)
    res["machine_after"] = _machine()
    write_scale(res, out)
    return res
