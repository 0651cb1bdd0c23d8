"""`recallspec conformance`: the conformance table (src/recallspec/conformance/)."""

from __future__ import annotations

import argparse
import shlex
import sys


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "conformance",
        help="hold our models against transformers and native llama.cpp on tiny random "
             "checkpoints of every supported architecture, and write the table")
    p.add_argument("--variants", default=None,
                   help="comma-separated variant names (default: all; see "
                        "recallspec/conformance/variants.py)")
    p.add_argument("--quants", default="Q8_0,Q4_0,Q4_K_M",
                   help="formats checked against llama.cpp (default: %(default)s)")
    p.add_argument("--no-llamacpp", action="store_true",
                   help="only the fp32 rows against transformers (no native llama.cpp)")
    p.add_argument("--out", default="docs/conformance",
                   help="directory for conformance.json and conformance.md "
                        "(default: %(default)s)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from recallspec.conformance import report
    from recallspec.conformance.checkpoints import QUANTS
    from recallspec.conformance.variants import VARIANTS, get_variant
    from recallspec.errors import DataError

    names = args.variants.split(",") if args.variants else list(VARIANTS)
    variants = [get_variant(n.strip()) for n in names]
    quants = [q.strip() for q in args.quants.split(",") if q.strip()]
    bad = [q for q in quants if q not in QUANTS]
    if bad:
        raise DataError(f"unknown format(s) {', '.join(bad)} (known: {', '.join(QUANTS)})")
    rows = report.measure(variants, quants, llamacpp=not args.no_llamacpp)
    command = "recallspec " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    doc = report.write(rows, Path(args.out), command)
    failed = [f"{r['variant']} {r['format']}" for r in doc["rows"] if not r["passes"]]
    print(f"wrote {args.out}/conformance.md ({len(rows)} rows"
          f"{'; outside their bounds: ' + ', '.join(failed) if failed else ''})")
    return 1 if failed else 0
