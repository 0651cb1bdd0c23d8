"""`recallspec bench scale`: ours and native llama.cpp at the model shapes people run.

For each (shape, quantization) of the matrix, in one run on one machine:

* the GGUF: random weights at a published shape (``bench/common/shapes_gguf.py``), quantized by
  llama.cpp's own ``llama-quantize``, cached; speed is data-independent in both engines;
* ours (a child process per model, ``bench/scale/ours.py``): AR decode tok/s, prefill
  tok/s, the verification cost curve (k rows on ``cached`` tokens), resident memory,
  load time, achieved GB/s against the streaming read bandwidth measured in the run;
* native llama.cpp (``bench/common/llamacpp.py``): ``llama-bench`` tg and pp, and
  ``llama-server``'s verification curve (its timed prompt eval of k tokens on top of
  ``cached`` tokens already in its cache: logits of the last row only, so it slightly
  under-prices a verification that needs every row's), its resident memory and start;
* paired decode and prefill rounds (``decode_rounds``, ``prefill_rounds``): ours (a
  fresh child, decode or prefill only) and llama-bench's tg or pp, back to back, the
  order alternating by round, each after an idle pause; the median of the rounds'
  ratios is the ratio least moved by a shared VM's drift (the sequential measurements
  above put the two engines minutes apart);
* time to first token (``ttft_repeats``, ``bench/scale/cold_start.py``): ours from a fresh
  process on the first run (conversion and repack) and on a later run (the repack cache
  read), and llama-server's from its process start, each process after a pause;
* the batched verification curve (``batch_seqs``, by default a mixture of experts'
  only: ``bench/scale/moe_batch.py``): one forward of B sequences' chains of k rows,
  beside one sequence's chain of B x k rows and the cost model's price;
* with ``answers`` (a ``recallspec bench`` run of SmolLM2 on Spec-Bench with ``ar`` and
  the drafting methods): the predicted Spec-Bench tokens/s of our methods at the shape
  (``bench/scale/predict.py``), labelled as a prediction, with the replay's error on the
  real run beside it.

Results go to ``OUT/scale.json`` after every entry (an interrupted run resumes where it
stopped), ``scale.md`` and ``scale.png`` (``bench/scale/report.py``).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from recallspec.bench.common import llamacpp as lc
from recallspec.bench.common.machine import (
    busy_warning,
    machine_info,
    read_bandwidth,
    stream_bandwidth,
)
from recallspec.bench.common.method import recorded_sizing_default
from recallspec.bench.common.shapes import get_shape
from recallspec.bench.common.shapes_gguf import ensure_shape_gguf
from recallspec.bench.replay.exact import ReplayConfig, load_ar_answers
from recallspec.bench.scale import cold_start
from recallspec.bench.scale.config import ScaleConfig
from recallspec.bench.scale.llamacpp import llamacpp_side, one_rate, peer_description
from recallspec.bench.scale.moe import BOUNDS, bound_curve
from recallspec.bench.scale.predict import fitted_model, predict_at_curve
from recallspec.bench.scale.report import plot_scale, render_scale_markdown
from recallspec.cost.curve import CostCurve
from recallspec.engine import Engine
from recallspec.errors import DataError
from recallspec.models.gguf.header import read_header
from recallspec.params import MAX_DRAFT_NODES


def _ours(gguf: Path, cfg: ScaleConfig, curve_out: Path | None, say: Callable[[str], None],
          only: str | None = None, repeats: int | None = None) -> dict[str, Any]:
    """Our child's measurements: everything, with the curve written to ``curve_out``; or
    ``only`` "decode" or "prefill" (a paired round's side), medians of ``repeats``
    (default ``cfg.repeats``)."""
    if (only is None) == (curve_out is None):
        raise ValueError("_ours measures everything (curve_out) or one side (only), not both")
    cmd = [sys.executable, "-m", "recallspec.bench.scale.ours", str(gguf),
           "--repeats", str(repeats or cfg.repeats),
           "--new-tokens", str(cfg.new_tokens),
           "--prefill", str(cfg.prefill), "--ks", ",".join(map(str, cfg.ks)),
           "--cached", str(cfg.cached)]
    cmd += ["--only", only] if only else ["--curve-out", str(curve_out)]
    if not only:  # (the batched curve: with the full measurement only)
        if cfg.batch_seqs is not None:
            cmd += ["--batch-seqs", ",".join(map(str, cfg.batch_seqs)) or "0"]
        cmd += ["--batch-ks", ",".join(map(str, cfg.batch_ks))]
    if cfg.threads:
        cmd += ["--threads", str(cfg.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        say(f"  ours failed (exit {proc.returncode}): {tail}")
        return {"error": f"exit {proc.returncode}: {tail}"}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# MiB the streaming read reads at each paired round's start (a quarter of the run's).
STREAM_ROUND_MIB = 256


def paired_rounds(gguf: Path, cfg: ScaleConfig, threads: int, measure: str, rounds: int,
                  say: Callable[[str], None], repeats: int = 1) -> list[dict[str, Any]]:
    """``rounds`` rounds of {"ours", "llamacpp": tok/s, "first": which ran first,
    "read_gb_s": the streaming read at the round's start}: ours in a
    fresh child and llama-bench, back to back, the order alternating by round, each after
    ``cfg.pair_idle_s`` idle. ``measure``: "decode" (``new_tokens``: AR decode and tg) or
    "prefill" (``prefill`` tokens: one prefill forward and pp), each side the median of
    ``repeats`` after its warm-up (once by default: the rounds' median is the estimate,
    and a large model's prefill side is slow). A round whose either half failed is left
    out (and said)."""
    if measure not in ("decode", "prefill"):
        raise ValueError(f"measure must be 'decode' or 'prefill', got {measure!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    tokens = cfg.new_tokens if measure == "decode" else cfg.prefill
    done = []
    for r in range(rounds):
        first = "ours" if r % 2 == 0 else "llamacpp"
        # The VM's bandwidth at the round's start: a decode bound by it moves with it (the
        # ratio of a decode bound by it to one that is not moves too).
        got: dict[str, Any] = {"first": first,
                               "read_gb_s": read_bandwidth(STREAM_ROUND_MIB, 3)}
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
                f"{got['llamacpp']:.2f} tok/s ({got['ours'] / got['llamacpp']:.2f}x; stream "
                f"{got['read_gb_s']:.1f} GB/s)")
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
    """``bench/scale/cold_start.py``'s figures for one model, or {"error": ...}."""
    try:
        return cold_start.measure(
            gguf, cold_start.ColdStartConfig(threads=threads, repeats=cfg.ttft_repeats,
                                             peer=cfg.llamacpp), scratch=out, say=say)
    except (DataError, lc.LlamaCppError) as e:  # (PeerNotBuilt is a DataError) the run goes on
        say(f"  time to first token failed: {e}")
        return {"error": str(e)}


def token_bytes(gguf: Path) -> int:
    """The bytes of ``gguf``'s tensors one decode token reads, counted as ours counts its
    own (``bench/common/decode.quantized_bytes_per_token``): every tensor whole, except a
    mixture's stacked expert tensors (``*_exps.weight``, gpt-oss's ``*_exps.bias``) at
    ``expert_used_count`` of ``expert_count`` and the embedding at one row (whole when it
    is the head too: no ``output.weight``). A dense file's is its data less the
    embedding's other rows; a mixture's is far less than the file (gpt-oss-20b MXFP4_MOE:
    about 2.6 of 12.1 GB)."""
    h = read_header(gguf)
    arch = h.metadata.get("general.architecture")
    experts = int(h.metadata.get(f"{arch}.expert_count", 0) or 0)
    used = int(h.metadata.get(f"{arch}.expert_used_count", 0) or 0)
    tied = not any(t.name == "output.weight" for t in h.tensors)
    total = 0
    for t in h.tensors:
        if experts and t.name.endswith(("_exps.weight", "_exps.bias")):
            total += t.n_bytes * used // experts
        elif t.name == "token_embd.weight" and not tied:
            total += t.n_bytes // t.shape[0]
        else:
            total += t.n_bytes
    return total


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
        # (the bytes of the file a token reads, as ours's achieved_gb_s counts its own: a
        # mixture's routed experts only, not the whole file)
        d["llamacpp_gb_s"] = entry["token_bytes"] * lc["tg_tok_s"] / 1e9
    for measure in ("decode", "prefill"):
        summary = paired_summary(entry.get(f"paired_{measure}", []))
        if summary:
            d[f"{measure}_vs_llamacpp_paired"] = summary
    entry["derived"] = d


def _bound_curves(entry: dict[str, Any], curve_file: Path) -> dict[str, str]:
    """A mixture of experts' measured curve re-priced at each routing bound
    (``bench/scale/moe.py``), written to ``<curve>-<bound>.json``: {bound: path}."""
    ours, layers = entry["ours"], get_shape(entry["shape"]).layers
    curve = CostCurve.from_json(json.loads(curve_file.read_text(encoding="utf-8")))
    out = {}
    for bound in BOUNDS:
        path = curve_file.with_name(f"{curve_file.stem}-{bound}.json")
        path.write_text(json.dumps(bound_curve(curve, ours, layers, bound).to_json(), indent=1),
                        encoding="utf-8")
        out[bound] = str(path)
    return out


def write_scale(res: dict[str, Any], out: Path) -> None:
    """scale.json, scale.md and scale.png in ``out``."""
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
    (``bench/scale/predict.py``); also for a table measured before
    (``benchmarks/experiments/exp_repredict.py``)."""
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
                         "fit": fit, "replay_error_on_real_run": check, "entries": {},
                         "bounds": {}}
    for key, entry in res["entries"].items():
        # (A mixture of experts: at its measured curve and at each routing bound's,
        # ``bench/scale/moe.py``.)
        for bound, path in (("", entry.get("curve_file")),
                            *entry.get("bound_curve_files", {}).items()):
            if not path or not Path(path).is_file():
                continue
            say(f"prediction at {key}" + (f" ({bound})" if bound else ""))
            curve = CostCurve.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
            pred = predict_at_curve(recs, rc, curve, methods, fit)
            if bound:
                res["prediction"]["bounds"].setdefault(bound, {})[key] = pred
            else:
                res["prediction"]["entries"][key] = pred


def run_scale(cfg: ScaleConfig, out: Path,
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    say = log or (lambda m: print(m, flush=True, file=sys.stderr))
    path = out / "scale.json"
    res: dict[str, Any] = {}
    if path.is_file():  # (--overwrite measures the asked entries again, keeps the rest)
        res = json.loads(path.read_text(encoding="utf-8"))
        say(f"resuming {path}: {len(res.get('entries', {}))} entries already measured")
    res.setdefault("entries", {})
    res["config"] = asdict(cfg)
    res["machine"] = machine_info()
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
                                 "token_bytes": token_bytes(gguf),
                                 "loadavg_1m_before": machine_info()["loadavg_1m"],
                                 "stream": res["stream"]}
        curve_file = out / "curves" / f"{shape}-{quant}.json"
        curve_file.parent.mkdir(parents=True, exist_ok=True)
        mb = entry["file_bytes"] / 1e6
        say(f"[{key}] ours: decode, prefill, verification curve ({mb:,.0f} MB file)")
        entry["ours"] = _ours(gguf, cfg, curve_file, say)
        if "error" not in entry["ours"]:
            entry["curve_file"] = str(curve_file)
            if "experts_touched" in entry["ours"]:
                entry["bound_curve_files"] = _bound_curves(entry, curve_file)
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
    res["machine_after"] = machine_info()
    write_scale(res, out)
    return res
