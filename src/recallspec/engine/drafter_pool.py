"""The engine's drafter instances, and what each request drafts with.

Instances: created from a ``DrafterSpec`` (name and options), bound once, kept warm. A
drafter with learned state (token recycling's table, a SAM index) serves every request
that names it with the same options, across requests and ``generate`` calls. Beyond
MAX_IDLE_DRAFTERS instances, the least recently used ones no request holds are dropped
(a server's clients may ask for any options).

A request's drafting (``drafting``): its drafter instance and sizing (every request has
the one batch layout, EMS-SD's unpadded one). The sizing is the first stated of

1. the request's ``sizing``;
2. the request's ``mode`` (a sizing word: ``engine/config.py``'s ``parse_sizing``);
3. the sizing stated by the ``DrafterSpec`` the request passes;
4. the config's ``mode``;
5. the sizing stated by the config's drafter spec, for a request naming no drafter;
6. ``DEFAULT_SIZING``: cost-aware, for every drafter named without a sizing;

and plain decoding is never sized (``effective_sizing``). What the request states beats
the config, the config beats the default.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from recallspec.cost.sizing import DEFAULT_SIZING, SIZINGS, Sizing
from recallspec.drafters.base import Drafter, DrafterContext, checked_instance
from recallspec.drafters.registry import create_drafter
from recallspec.drafters.spec import DrafterSpec, Options, effective_sizing
from recallspec.engine.config import EngineConfig, parse_sizing
from recallspec.errors import UnknownNameError

MAX_IDLE_DRAFTERS = 16

# A drafter as a request may give it: a registered name (with ``drafter_options``), a
# parsed spec, an instance, or None for the config's default.
DrafterArg = str | DrafterSpec | Drafter | None


@dataclass(frozen=True)
class Drafting:
    """What one request drafts with, resolved and validated (see the module docstring)."""

    drafter: Drafter
    sizing: Sizing  # how its drafts are sized (``cost/sizing.py``)


class DrafterPool:
    def __init__(self, context: Callable[[], DrafterContext], config: EngineConfig,
                 in_use: Callable[[], set[int]]) -> None:
        self._context = context  # what ``bind`` gets
        self._config = config  # its ``default_drafter`` and ``default_sizing``
        self._in_use = in_use  # ids of the drafter instances requests hold
        self._pool: OrderedDict[tuple[str, Options], Drafter] = OrderedDict()

    def get(self, spec: DrafterSpec) -> Drafter:
        """The instance for ``spec``'s name and options, whatever its sizing
        (``UnknownNameError`` for an unknown name or options the drafter refuses)."""
        key = (spec.name, spec.options)
        try:
            hash(key)
        except TypeError:
            raise UnknownNameError(f"bad options for drafter {spec.name!r}: values must be "
                                   "scalars") from None
        if key in self._pool:
            self._pool.move_to_end(key)
            return self._pool[key]
        try:
            d = create_drafter(spec.name, **spec.kwargs)
            # Drafters that run (part of) the target model or check its tokenizer
            # (draft-model, a static SAM index, datastores) take what they need.
            d.bind(self._context())
        except ValueError as e:
            raise UnknownNameError(f"bad options for drafter {spec.name!r}: {e}") from None
        self._pool[key] = d
        held = self._in_use()
        idle = [k for k, v in self._pool.items() if id(v) not in held]
        for k in idle[: max(len(self._pool) - MAX_IDLE_DRAFTERS, 0)]:  # oldest first
            del self._pool[k]
        return d

    def spec(self, drafter: str | DrafterSpec | None,
             options: Mapping[str, Any] | None = None) -> DrafterSpec:
        """The spec of a drafter given by name, by spec or (None) the config's default,
        with ``options`` over its own."""
        if drafter is None:
            return self._config.default_drafter.with_options(options)
        if isinstance(drafter, str):  # a name, or a spec's text ("pld:mode=fixed")
            return DrafterSpec.parse(drafter).with_options(options)
        return drafter.with_options(options)

    def resolve(self, drafter: DrafterArg, options: Mapping[str, Any] | None = None) -> Drafter:
        """A drafter instance: by name or spec (plus options), as given, or the default."""
        if drafter is None or isinstance(drafter, str | DrafterSpec):
            return self.get(self.spec(drafter, options))
        return checked_instance(drafter)

    def drafting(self, drafter: DrafterArg = None, options: Mapping[str, Any] | None = None,
                 mode: str | None = None, sizing: Sizing | None = None) -> Drafting:
        """A request's drafting from what it states (see the module docstring);
        ``UnknownNameError`` for an unknown drafter, mode or sizing."""
        if sizing is not None and sizing not in SIZINGS:
            raise UnknownNameError(f"unknown sizing {sizing!r}; available: {', '.join(SIZINGS)}")
        mode_sizing = None if mode is None else parse_sizing(mode)
        cfg_sizing = self._config.default_sizing
        stated: tuple[Sizing | None, ...]
        if drafter is None or isinstance(drafter, str | DrafterSpec):
            spec = self.spec(drafter, options)
            d = self.get(spec)
            if drafter is None:  # the config's own spec ranks below the config's mode
                stated = (sizing, mode_sizing, cfg_sizing, spec.sizing)
            else:
                stated = (sizing, mode_sizing, spec.sizing, cfg_sizing)
        else:
            d = checked_instance(drafter)
            stated = (sizing, mode_sizing, cfg_sizing)
        chosen: Sizing = DEFAULT_SIZING
        for s in stated:  # the first stated, else the default
            if s is not None:
                chosen = s
                break
        return Drafting(d, effective_sizing(d.name, chosen))
