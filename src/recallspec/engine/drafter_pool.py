"""The engine's drafter instances: created by name and options, bound once, kept warm.

A drafter with learned state (token recycling's table, a SAM index) serves every request
that names it with the same options, across requests and ``generate`` calls. Beyond
MAX_IDLE_DRAFTERS instances, the least recently used ones no request holds are dropped
(a server's clients may ask for any options).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from recallspec.drafters.base import Drafter, DrafterContext, create_drafter, parse_spec
from recallspec.errors import UnknownNameError

MAX_IDLE_DRAFTERS = 16


class DrafterPool:
    def __init__(self, context: Callable[[], DrafterContext], default_spec: str,
                 in_use: Callable[[], set[int]]) -> None:
        self._context = context  # what ``bind`` gets
        self._default = default_spec  # "name" or "name:key=value:..." (EngineConfig.drafter)
        self._in_use = in_use  # ids of the drafter instances requests hold
        self._pool: OrderedDict[tuple[str, tuple[tuple[str, Any], ...]], Drafter] = (
            OrderedDict())

    def get(self, name: str, **options: Any) -> Drafter:
        """The instance for ``name`` and ``options`` (``UnknownNameError`` for an unknown
        name or options the drafter refuses)."""
        key = (name, tuple(sorted(options.items())))
        try:
            hash(key)
        except TypeError:
            raise UnknownNameError(f"bad options for drafter {name!r}: values must be "
                                   "scalars") from None
        if key in self._pool:
            self._pool.move_to_end(key)
            return self._pool[key]
        try:
            d = create_drafter(name, **options)
            # Drafters that run (part of) the target model or check its tokenizer
            # (draft-model, a static SAM index, datastores) take what they need.
            bind = getattr(d, "bind", None)
            if callable(bind):
                bind(self._context())
        except ValueError as e:
            raise UnknownNameError(f"bad options for drafter {name!r}: {e}") from None
        self._pool[key] = d
        held = self._in_use()
        idle = [k for k, v in self._pool.items() if id(v) not in held]
        for k in idle[: max(len(self._pool) - MAX_IDLE_DRAFTERS, 0)]:  # oldest first
            del self._pool[k]
        return d

    def resolve(self, drafter: str | Drafter | None,
                options: Mapping[str, Any] | None = None) -> Drafter:
        """A drafter by name (plus options), an instance as is, or (None) the default
        spec's, its options under ``options``."""
        if drafter is None:
            name, opts = parse_spec(self._default)
            return self.get(name, **{**opts, **(options or {})})
        if isinstance(drafter, str):
            return self.get(drafter, **(options or {}))
        return drafter
