"""Drafters by name: a fixed table of ``name -> "module:factory"``, imported on first use.

A name is what the engine, the CLI, the server (``recallspec.drafter``) and the benchmarks
accept; a factory takes the drafter's options as keyword arguments. The table is the one
place a new built-in drafter is named; a drafter that is not built in is passed as an
instance instead (``base.checked_instance``). Importing this module imports no drafter.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, cast

from recallspec.drafters.base import Drafter
from recallspec.errors import UnknownNameError

__all__ = ["BUILTIN", "available_drafters", "create_drafter", "factory"]

BUILTIN: Mapping[str, str] = MappingProxyType({
    "none": "recallspec.drafters.lookup:NoDrafter",
    "pld": "recallspec.drafters.lookup:make_pld",
    "llma": "recallspec.drafters.lookup:make_llma",
    "recycling": "recallspec.drafters.recycling:make_recycling",
    "sam": "recallspec.drafters.sam:make_sam",
    "sam+recycling": "recallspec.drafters.sam:make_sam_recycling",
    "portfolio": "recallspec.drafters.portfolio:make_portfolio",
    "rest": "recallspec.drafters.retrieval:make_rest",
    "crest": "recallspec.drafters.retrieval:make_crest",
    "draft-model": "recallspec.drafters.draft_model:make_draft_model",
    "sam+draft-model": "recallspec.drafters.draft_model:make_sam_draft_model",
})


def available_drafters() -> list[str]:
    """The built-in drafters' names, sorted."""
    return sorted(BUILTIN)


def factory(name: str) -> Callable[..., Drafter]:
    """The factory of a built-in drafter (its module imported now)."""
    try:
        target = BUILTIN[name]
    except KeyError:
        raise UnknownNameError(
            f"unknown drafter {name!r}; available: {', '.join(available_drafters())}"
        ) from None
    module, _, attr = target.partition(":")
    return cast("Callable[..., Drafter]", getattr(importlib.import_module(module), attr))


def create_drafter(name: str, **options: Any) -> Drafter:
    """Instantiate a built-in drafter; options are its factory's keyword arguments."""
    make = factory(name)
    try:
        return make(**options)
    except TypeError as e:
        raise UnknownNameError(f"bad options for drafter {name!r}: {e}") from None
