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

# Command modules, in the order `recallspec --help` lists them.
_COMMAND_MODULES = (
    "recallspec.cli.generate",
    "recallspec.cli.serve",
    "recallspec.cli.bench",
    "recallspec.cli.index",
    "recallspec.cli.datastore",
    "recallspec.cli.corpus",
    "recallspec.demo",
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
