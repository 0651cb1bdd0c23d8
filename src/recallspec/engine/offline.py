"""``Engine.generate``: a batch of prompts run to completion as a client of the online
API (``add_request`` / ``step``), so there is one decoding path.

A single prompt returns one result and raises on bad input; a list returns a result per
prompt, in order, where a bad request gets ``finish_reason == "error"`` and the others
complete. An exception inside the run (e.g. a drafter's) is raised again here, after
every request of the call was aborted, so the engine stays usable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from typing import Any, Protocol

from recallspec.cost.curve import CostCurve
from recallspec.cost.sizing import Sizing
from recallspec.decoding.sampling import SamplingParams
from recallspec.engine.drafter_pool import DrafterArg, DrafterPool
from recallspec.engine.outputs import GenerationResult, RequestOutput, StepStats
from recallspec.engine.prompts import Prompt, is_single
from recallspec.engine.scheduler import Scheduler
from recallspec.errors import RecallspecError

Progress = Callable[[int], None]  # called with the number of newly committed tokens


class OnlineEngine(Protocol):
    """The online API ``generate`` drives (``engine.Engine`` has it)."""

    stats: StepStats

    @property
    def drafters(self) -> DrafterPool: ...
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def num_running(self) -> int: ...
    def has_unfinished(self) -> bool: ...
    def cost_curve(self) -> CostCurve: ...
    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, *,
        drafter: DrafterArg = None, sizing: Sizing | None = None, chat: bool = False,
        arrival: float | None = None, tenant: str | None = None, memory: bool = True,
        prefix_cache: bool = True,
    ) -> int: ...
    def step(self) -> list[RequestOutput]: ...
    def abort(self, rid: int) -> RequestOutput | None: ...


def generate(
    engine: OnlineEngine,
    prompts: Any,
    params: SamplingParams | Sequence[SamplingParams] | None = None,
    *,
    drafter: DrafterArg = None,
    drafter_options: Mapping[str, Any] | None = None,
    chat: bool = False,
    progress: Progress | None = None,
    mode: str | None = None,
    sizing: Sizing | None = None,
    arrivals: Sequence[float] | None = None,
    tenant: str | None = None,
    memory: bool = True,
    prefix_cache: bool = True,
) -> GenerationResult | list[GenerationResult]:
    """Generate for one prompt (text, token ids, chat messages) or a list of them.

    Up to ``max_batch_size`` requests decode together (continuous batching): a waiting
    request takes a free slot at the next step and is prefilled chunk by chunk inside
    the running batch's forwards. ``drafter``, ``mode`` and ``sizing`` apply to every
    request, as in ``add_request`` (resolved once, here); every sizing commits the same
    tokens. ``arrivals`` (seconds after the call, one per prompt) holds each request
    back until it arrives, to simulate online traffic;
    ``GenerationResult.latency`` counts from the arrival. ``Engine.stats`` counts this
    call's steps. ``tenant``, ``memory`` and ``prefix_cache`` apply to every request
    (``add_request``).
    The engine must be idle (no requests of the online API in flight).
    """
    single = is_single(prompts)
    plist: list[Any] = [prompts] if single else list(prompts)
    if not plist:
        return []
    if params is None:
        params = SamplingParams()
    plist_params = [params] * len(plist) if isinstance(params, SamplingParams) else list(params)
    if len(plist_params) != len(plist):
        raise ValueError("need one SamplingParams per prompt")
    if arrivals is not None and (
        len(arrivals) != len(plist) or any(b < a for a, b in pairwise(arrivals))
    ):
        raise ValueError("arrivals must give one non-decreasing time per prompt")
    if engine.has_unfinished():
        raise RuntimeError("generate() needs an idle engine: requests added with "
                           "add_request are still in flight")
    how = engine.drafters.drafting(drafter, drafter_options, mode, sizing)
    if how.sizing == "adaptive":
        engine.cost_curve()  # calibrate (or load) before any request's clock starts
    t0 = time.perf_counter()
    engine.stats = StepStats()
    results: list[GenerationResult | None] = [None] * len(plist)
    index: dict[int, int] = {}  # rid -> position in the caller's list
    try:
        for i, (p, sp) in enumerate(zip(plist, plist_params, strict=True)):
            try:
                arrival = t0 + (arrivals[i] if arrivals is not None else 0.0)
                rid = engine.add_request(p, sp, drafter=how.drafter, sizing=how.sizing,
                                         chat=chat, arrival=arrival, tenant=tenant,
                                         memory=memory, prefix_cache=prefix_cache)
            except RecallspecError as e:
                if single:
                    raise
                results[i] = GenerationResult(0, [], "", "error", [], 0.0, 0.0, error=str(e))
                continue
            index[rid] = i
        while engine.has_unfinished():
            outs = engine.step()
            for o in outs:
                if progress and o.num_committed:
                    progress(o.num_committed)
                if o.finished:
                    if o.exception is not None:
                        raise o.exception
                    results[index[o.rid]] = o.result
            nxt = engine.scheduler.next_arrival()
            if not outs and not engine.num_running and nxt is not None:
                time.sleep(max(nxt - time.perf_counter(), 0.0))  # idle until it arrives
    finally:
        # On an exception (or Ctrl-C) give every slot back so the engine stays usable.
        for rid in index:
            engine.abort(rid)
    out = [r for r in results if r is not None]
    assert len(out) == len(plist)
    return out[0] if single else out
