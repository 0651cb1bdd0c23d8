"""Command-line interface: `recallspec <command> ...`.

Each command group lives in its own module exposing ``register(subparsers)``; the
handler it sets returns an exit code. User errors (``RecallspecError``) become one
clear line on stderr and exit code 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from recallspec.errors import RecallspecError
from recallspec.params import MAX_DRAFT_NODES

# The --kv-dtype, --no-repack-cache and --max-draft-nodes help the commands that load a
# model share.
KV_HELP = ("KV cache: auto = float32 (a 16-bit cache did not pay at Spec-Bench "
           "lengths); float16 halves its memory and the bytes a decode row's attention "
           "reads (plain decoding gains more the more tokens are cached); verification "
           "and prefill rows widen it once per tile, so their attention costs about "
           "float32's. Its outputs differ from float32's; each is lossless on its own.")
REPACK_CACHE_HELP = ("do not save a GGUF's repacked quantized weights in the cache at its "
                     "first load (a file somewhat larger than the GGUF, written in the "
                     "background and read by later loads): repack in memory at every start "
                     "instead")
MAX_DRAFT_NODES_HELP = (f"draft-tree nodes verified per request and step, at most (default "
                        f"{MAX_DRAFT_NODES}; cost-aware sizing drafts fewer where rows do not "
                        "pay; workloads that re-send long texts gain from more, e.g. 32)")

# Command modules, in the order `recallspec --help` lists them.
_COMMAND_MODULES = (
    "recallspec.cli.generate",
    "recallspec.cli.serve",
    "recallspec.cli.bench",
    "recallspec.cli.index",
    "recallspec.cli.datastore",
    "recallspec.cli.corpus",
    "recallspec.cli.conformance",
    "recallspec.cli.demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recallspec",
        description="Lossless speculative decoding with drafts recalled from text.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except RecallspecError as e:
        print(f"recallspec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("recallspec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
