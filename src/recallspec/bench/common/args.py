"""Argument types and option readers shared by the bench's command lines (each
sub-package's ``cli.py``) and the child processes they start.

Imports nothing heavy: the CLI builds its parsers without loading torch or a model.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

from recallspec.errors import DataError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    Settings = TypeVar("Settings", bound=DataclassInstance)


def positive_ints(s: str) -> tuple[int, ...]:
    """``1,2,4``: comma-separated positive integers, as an argparse ``type``
    (``recallspec bench scale --ks`` and its child's ``--ks`` / ``--contexts``, which
    ``bench/scale/command._ours`` writes)."""
    try:
        vals = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {s!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"need positive integers: {s!r}")
    return vals


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
