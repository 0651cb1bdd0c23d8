"""Time to first token of a GGUF from a fresh process: ours on the first run and on a
later run against native llama-server, in one run (``recallspec.bench.scale.cold_start``,
which ``recallspec bench scale`` also runs per model; how and why it measures: there).

    .venv/bin/python benchmarks/experiments/exp_cold_start.py --model PATH.gguf --repeats 3 \\
        --out bench_out/cold_start

Writes OUT/cold_start.json and OUT/cold_start.md (medians over the repeats).

Feeds docs/BENCHMARKS.md, "Memory and start-up" (command [M1]).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _common import utc_now, write_outputs

from recallspec.bench.scale.cold_start import ColdStartConfig, measure, render_markdown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="a GGUF file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench_out/cold_start"))
    ap.add_argument("--pause", type=float, default=ColdStartConfig.pause_s,
                    help="idle seconds before each process starts (0: none)")
    ap.add_argument("--no-peer", action="store_true",
                    help="ours only (e.g. an older checkout's, for a before/after)")
    args = ap.parse_args()
    if not args.model.is_file():
        raise SystemExit(f"--model {args.model}: no such file")
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = ColdStartConfig(threads=args.threads, repeats=args.repeats, pause_s=args.pause,
                          peer=not args.no_peer)
    res = measure(args.model, cfg, scratch=args.out, say=print)
    res = {"model": str(args.model), "file_mb": args.model.stat().st_size / 1e6,
           "date": utc_now(), **res}
    md = render_markdown(res, f"{args.model.name} ({res['file_mb']:,.0f} MB, {res['date']})")
    write_outputs(args.out / "cold_start", res, md.splitlines())


if __name__ == "__main__":
    main()
