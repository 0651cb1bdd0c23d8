"""The suite's methods: our engine's (``ar`` and every drafter spec) and the peers'
(each in a child process of its own, ``bench/peers/``: a crashing peer fails alone).

What a method name means and what a turn returns: ``bench/common/method.py``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import torch

from recallspec.bench.common.hf import gguf_path_for
from recallspec.bench.common.llamacpp import ServerConfig
from recallspec.bench.common.llamacpp import available as llamacpp_available
from recallspec.bench.common.method import (
    HF_METHODS,
    LLAMACPP_METHODS,
    Method,
    TurnOutput,
    baseline_of,
    method_spec,
)
from recallspec.bench.peers.methods import ChildMethod, ServerMethod, peer_command
from recallspec.decoding.sampling import SamplingParams
from recallspec.drafters import available_drafters, create_drafter
from recallspec.drafters.spec import NO_DRAFTER, DrafterSpec
from recallspec.errors import DataError, UnknownNameError


def engine_timing(stats: Any) -> dict[str, float]:
    """A turn's split from ``Engine.stats`` (batch 1: counters since ``generate`` began):
    decoding steps, rows fed to them, seconds inside their forwards, seconds drafting,
    and the decode-only steps' whole wall time (the rest of the turn is the prefill)."""
    return {"steps": float(stats.steps), "rows": float(stats.rows),
            "forward_s": float(stats.forward_s), "draft_s": float(stats.draft_s),
            "decode_s": float(stats.decode_only_s)}


def check_method_names(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """(runnable names, skip messages); unknown names or options raise clear errors."""
    drafters = available_drafters()
    known = ["ar", *[d for d in drafters if d != NO_DRAFTER], *HF_METHODS, *LLAMACPP_METHODS]
    bases = []
    for name in names:
        spec = DrafterSpec.parse(name)  # a bad option or sizing fails here
        bases.append(spec.name)
        if spec.name in HF_METHODS or spec.name in LLAMACPP_METHODS:
            if name != spec.name:
                raise DataError(f"method {name!r}: peer methods take no options")
        elif spec.name in drafters and spec.options:
            create_drafter(spec.name, **spec.kwargs)  # bad options fail now, not later
    unknown = [n for n, b in zip(names, bases, strict=True)
               if b not in known and n != NO_DRAFTER]
    if unknown:
        raise UnknownNameError(
            f"unknown method(s) {', '.join(unknown)}; available: {', '.join(known)}"
        )
    if len(set(names)) != len(names):
        raise DataError("a method is listed twice")
    run, skipped = [], []
    for n in names:
        if n in LLAMACPP_METHODS and not llamacpp_available():
            skipped.append(f"skipping {n}: native llama.cpp is not built (make peers)")
            continue
        if n in HF_METHODS and importlib.util.find_spec("transformers") is None:
            raise DataError(f"method {n} needs transformers: pip install 'recallspec[hf]'")
        run.append("ar" if n == "none" else n)
    return run, skipped


# ---- our engine ------------------------------------------------------------------


class EngineMethod:
    def __init__(self, engine: Any, name: str) -> None:
        self.engine = engine
        self.name = name  # as written: the answers' label
        self.baseline = "ar"
        self._spec = method_spec(name)  # parsed once; the engine takes the object

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> TurnOutput:
        # Every turn from a cold prefill, as the peers answer (llama-server without
        # cache_prompt, llama-cpp-python reset): with the engine's prefix cache a method
        # would start from the KV an earlier method (or turn) left for the same prompt.
        res = self.engine.generate(prompt_ids, params, drafter=self._spec, prefix_cache=False)
        timing = {**engine_timing(self.engine.stats), "cached_tokens": float(res.cached_tokens)}
        return TurnOutput(
            list(res.token_ids), res.text, list(res.accept_lengths), float(res.wall_time),
            int(res.prompt_tokens), str(res.finish_reason), timing,
        )


# ---- construction ------------------------------------------------------------------


class MethodFactory:
    """Builds methods for one engine; peers get a child process each (a native
    ``llama-server`` for ``llamacpp-*``, ``bench/peers/worker.py`` for ``hf-*``)."""

    def __init__(self, engine: Any, model_spec: str | None, dtype: str = "float32") -> None:
        self.engine = engine
        self.model_spec = model_spec
        self.dtype = dtype

    def create(self, name: str) -> Method:
        threads = int(getattr(self.engine, "threads", 0) or _torch_threads())
        if name in LLAMACPP_METHODS:
            spec = name.removeprefix("llamacpp-")
            cfg = ServerConfig(gguf_path_for(self.model_spec), threads,
                               spec_type=None if spec == "greedy" else spec)
            return ServerMethod(name, cfg, self.engine.tokenizer, baseline_of(name))
        if name in HF_METHODS:
            cmd = peer_command(name, self.model_spec, threads, self.dtype)
            return ChildMethod(name, cmd, self.engine.tokenizer, baseline_of(name))
        return EngineMethod(self.engine, name)


def _torch_threads() -> int:
    return int(torch.get_num_threads())
