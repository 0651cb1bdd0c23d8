"""Drafter specs: ``name:key=value:...`` parsed once into a frozen ``DrafterSpec``.

The command line (``--drafter``, ``--methods``), ``EngineConfig.drafter``, the demo and
the benchmarks name a drafter with its options this way, e.g.
``sam:index=alpaca.rsidx:delta=3``; values become ints, floats, true/false/none or
strings. One key is not a drafter option but the draft *sizing* (``cost/sizing.py``):
``mode=adaptive`` or ``mode=fixed`` (the key older specs and benchmark answer files use;
``sizing=`` means the same, and ``mode=ems``, once the fixed-size batch mode, reads as
fixed; EMS-SD's padded layouts are a benchmark ablation, never a spec's sizing). A spec
that states no sizing leaves it to the engine: its config's ``mode``, else
``DEFAULT_SIZING`` (cost-aware). Plain decoding (``none``) has nothing to size: fixed.

A spec is parsed where its text enters (the command line, a config, a method list) and
travels as this object; nothing downstream joins it into text to parse it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from recallspec.errors import DataError, UnknownNameError
from recallspec.params import SIZINGS, Sizing, sizing_refusal

NO_DRAFTER = "none"  # plain decoding
SIZING_KEYS = ("mode", "sizing")  # spec keys that state the sizing
# The sizing words a spec may write ("ems", the fixed-size batch mode of older specs and
# answer files, reads as fixed; the other batch-layout words are refused).
_SIZING_WORDS: dict[str, Sizing] = {"adaptive": "adaptive", "fixed": "fixed", "ems": "fixed"}

Options = tuple[tuple[str, Any], ...]


def effective_sizing(drafter: str, sizing: Sizing) -> Sizing:
    """The sizing of a request drafting with ``drafter``: plain decoding is never sized
    (adaptive sizing would measure a cost curve for drafts that never come)."""
    return "fixed" if drafter == NO_DRAFTER else sizing


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter by name, its constructor options and, where stated, its sizing."""

    name: str  # a registered drafter ("none": plain decoding), or a benchmark method's name
    options: Options = ()  # (key, value) pairs sorted by key; with ``name``, the pool's key
    sizing: Sizing | None = None  # None: not stated (the engine decides, see module doc)

    def __post_init__(self) -> None:
        if self.sizing is not None and self.sizing not in SIZINGS:
            raise UnknownNameError(f"unknown sizing {self.sizing!r}; available: "
                                   f"{', '.join(SIZINGS)}")
        # Invariants: one value per key, sorted by key (equal specs compare and hash equal);
        # plain decoding states fixed sizes.
        opts = tuple(sorted(dict(self.options).items(), key=lambda kv: kv[0]))
        object.__setattr__(self, "options", opts)
        if self.name == NO_DRAFTER:
            object.__setattr__(self, "sizing", "fixed")

    @classmethod
    def of(cls, name: str, options: Mapping[str, Any] | None = None,
           sizing: Sizing | None = None) -> DrafterSpec:
        """A spec from a name and an options mapping (the Python API's form)."""
        return cls(name, tuple((options or {}).items()), sizing)

    @classmethod
    def parse(cls, text: str) -> DrafterSpec:
        """``name:key=value:...`` -> spec (``DataError`` for a malformed option,
        ``UnknownNameError`` for a sizing other than adaptive or fixed)."""
        name, *parts = text.split(":")
        options: dict[str, Any] = {}
        sizing: Sizing | None = None
        for part in parts:
            key, sep, value = part.partition("=")
            if not sep or not key:
                raise DataError(f"drafter spec {text!r}: options go after the name as :key=value")
            if key not in SIZING_KEYS:
                options[key] = _value(value)
                continue
            word = _SIZING_WORDS.get(value.lower())
            if word is None:
                raise UnknownNameError(f"drafter spec {text!r}: {key}= is the draft sizing: "
                                       + sizing_refusal(value.lower()))
            sizing = word
        return cls(name, tuple(options.items()), sizing)

    @property
    def kwargs(self) -> dict[str, Any]:
        """The drafter's constructor options, as a new dict."""
        return dict(self.options)

    def with_options(self, extra: Mapping[str, Any] | None) -> DrafterSpec:
        """This spec with ``extra`` options over its own."""
        if not extra:
            return self
        return replace(self, options=tuple({**self.kwargs, **extra}.items()))

    def __str__(self) -> str:
        """The spec as text, as ``parse`` reads it."""
        parts = [self.name, *(f"{k}={_text(v)}" for k, v in self.options)]
        if self.sizing is not None and self.name != NO_DRAFTER:
            parts.append(f"mode={self.sizing}")
        return ":".join(parts)


def _value(v: str) -> Any:
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "none" if v is None else str(v)
