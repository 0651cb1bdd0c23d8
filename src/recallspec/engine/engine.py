"""The engine: requests in, one forward per step (prefill, draft, verify, commit), deltas out.

``add_request`` checks and queues a request (bad input raises at once); ``step`` admits
waiting requests to free KV slots, drafts, runs ONE ragged forward over every running
request (root + draft rows, plus prompt chunks of new ones), verifies, commits and
returns each request's delta; ``abort`` ends a request between steps. ``generate`` is a
loop over these (``offline.py``). Invariant per running request: its KV slot holds
prompt + generated[:-1]; ``generated[-1]`` (the root) is committed but not yet cached.

Recall: with ``memory_tokens`` the outputs of requests that end normally (not aborted
or failed) feed their tenant's response memory; ``corpora`` holds live corpora. Both
belong to the recall service (``recall/service.py``) and are built in background
threads; the SAM drafters see them through ``recall_view`` (``DrafterContext.recall``),
a read of immutable snapshots, so a step never waits for a build.

Faults: an exception inside one request's own calls (its drafter, its verification or
sampling) fails that request only; one in the shared forward fails the step's
requests. Either way their slots are freed and the engine stays usable.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping, Sequence
from itertools import chain, count
from typing import Any, overload

import numpy as np
import torch

from recallspec.cost.curve import CostCurve
from recallspec.cost.expert_counts import WokenExperts, expert_shape
from recallspec.cost.sizing import Sizing, draft_room
from recallspec.cost.source import CostCurveSource
from recallspec.decoding.penalties import Penalties
from recallspec.decoding.sampling import SamplingParams
from recallspec.decoding.tree import DraftTree
from recallspec.decoding.verify import sample
from recallspec.drafters.base import Drafter, DrafterContext
from recallspec.drafters.spec import DrafterSpec
from recallspec.engine import offline, prompts
from recallspec.engine.config import EngineConfig
from recallspec.engine.drafter_pool import DrafterArg, DrafterPool
from recallspec.engine.outputs import (
    GenerationResult,
    RequestOutput,
    StepStats,
    commit_tokens,
    record_logprobs,
    take_output,
)
from recallspec.engine.prefix_cache import PrefixCacheStats
from recallspec.engine.prompts import Prompt
from recallspec.engine.request import Request, RequestStatus
from recallspec.engine.runner import NativeVerifier, Runner
from recallspec.engine.scheduler import Scheduler, StepPlan
from recallspec.errors import DataError, ResourceError
from recallspec.grammar import GuideCache
from recallspec.kernels.threads import decode_threads
from recallspec.recall.service import RecallSources
from recallspec.recall.view import RecallView
from recallspec.runtime.kv_cache import KVCache, KVPrefix
from recallspec.step.core import speculative_step, tell_drafter
from recallspec.step.planner import DraftPlanner


def _say(message: str) -> None:
    """One-time notes of long work (the cost curve's measurement) on stderr."""
    print(f"recallspec: {message}", file=sys.stderr, flush=True)


class Engine:
    """Loads a model once; serves requests with any registered drafter."""

    def __init__(self, model: Any, tokenizer: Any, config: EngineConfig | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        self.context_len = int(model.config.max_position)
        self.max_len = min(self.context_len, self.config.max_len or 4096)
        try:  # (the model refuses a sequence larger than the free memory: new_cache)
            self.cache: KVCache = model.new_cache(self.config.max_batch_size, self.max_len)
        except ResourceError as e:  # the engine's cache: its settings are what to lower
            raise ResourceError(f"{e}; lower max_len (--max-len) or max_batch_size "
                                "(--max-batch-size)") from None
        self.threads = self.config.threads or torch.get_num_threads()
        self.stats = StepStats()
        self.curves = CostCurveSource(model, lambda: getattr(tokenizer, "fingerprint", ""),
                                      self.threads, _say)
        self.planner = DraftPlanner(self.config.max_draft_nodes, self.curves.current,
                                    expert_shape(model))
        # A mixture of experts: the experts each decode step's forward woke, for the
        # planner's pricing (None: dense; ``_execute``).
        self._woken = WokenExperts.of(model)
        self.scheduler = Scheduler.from_config(self.cache, self.config)
        self.runner = Runner(model, self.cache, self.max_len, self.threads)
        self.drafters = DrafterPool(self.drafter_context, self.config, lambda: {
            id(r.drafter) for r in chain(self.scheduler.waiting, self.scheduler.running.values())})
        self._rids = count()
        # Compiled grammars by (guide, vocabulary): each constrained request takes a fresh
        # matcher of its guide's (the server compiles on a worker thread first).
        self.guides = GuideCache()
        self._recall = RecallSources(self.config.recall, tokenizer, int(model.config.vocab_size))
        self.corpora = self._recall.corpora  # live corpora (``recall/live_corpora.py``)
        self.memory = self._recall.memory  # response memory, None when off

    @classmethod
    def load(cls, model: str | None = None, **config: Any) -> Engine:
        from recallspec.models import load_model

        cfg = EngineConfig(model=model, **config)
        m, tok = load_model(model, dtype=cfg.dtype, kv_dtype=cfg.kv_dtype,
                            repack_cache=cfg.repack_cache)
        return cls(m, tok, cfg)

    # ---- what steps run with: the cost curve (adaptive sizing), the runner -----------
    def use_cost_curve(self, curve: CostCurve) -> None:
        """Use this curve for adaptive sizing instead of measuring one (e.g. a curve
        measured by another engine on the same model, or a synthetic one in tests)."""
        self.curves.use(curve)

    def use_runner(self, runner: Runner | None) -> None:
        """Verify every step through ``runner``, a ``Runner`` subclass over this engine's
        model and KV cache (``engine/runner.py``: e.g. EMS-SD's padded layouts,
        ``bench/suite/padded_layouts.py``); None: the engine's own. Only between runs (the engine
        idle), so that one runner serves every request of a run."""
        if self.has_unfinished():
            raise RuntimeError("use_runner() needs an idle engine: requests are in flight")
        if runner is None:
            runner = Runner(self.model, self.cache, self.max_len, self.threads)
        elif runner.cache is not self.cache or runner.model is not self.model:
            raise ValueError("the runner must run this engine's model over its KV cache")
        self.runner = runner

    def wait_for_repack_cache(self) -> None:
        """Return once a first load's background repack cache write is done: timings
        taken meanwhile would price the disk writes (the cost curve, benchmarks)."""
        self.curves.wait_for_writer()

    def cost_curve(self) -> CostCurve:
        """The verification cost curve of this model on this machine (measured once,
        cached on disk next to the converted model weights; a background measurement,
        ``start_cost_curve``, is finished now)."""
        return self.curves.measured()

    def start_cost_curve(self) -> bool:
        """Read the cached cost curve, or measure it in the background while serving,
        drafts priced by a conservative prior meanwhile (``cost/source.py``; the
        caller's loop grants it turns: ``curves.advance``). Returns whether a
        measurement is under way."""
        return self.curves.start_background()

    # ---- prompts and drafters --------------------------------------------------------
    def encode_prompt(self, prompt: str, *, chat: bool = False) -> list[int]:
        """Token ids of a text prompt (with ``chat``, as one user turn of the template)."""
        return prompts.encode_text(self.tokenizer, prompt, chat=chat)

    def prompt_ids(self, prompt: Prompt, *, chat: bool = False) -> list[int]:
        """Token ids of any prompt form, checked against the vocabulary and context."""
        ids = prompts.prompt_ids(self.tokenizer, prompt, chat=chat)
        prompts.check_ids(ids, int(self.model.config.vocab_size), self.context_len, self.max_len)
        return ids

    def drafter_context(self) -> DrafterContext:
        """What a drafter may know of this engine (``Drafter.bind``)."""
        return DrafterContext(
            target=self.model, fingerprint=lambda: getattr(self.tokenizer, "fingerprint", None),
            vocab_size=int(self.model.config.vocab_size),
            max_batch_size=self.config.max_batch_size, max_len=self.max_len,
            kv_prefix=self.kv_prefix, recall=self.recall_view,
        )

    def drafter(self, name: str, **options: Any) -> Drafter:
        """The engine's instance of a drafter: kept across requests so that drafters
        with learned state (e.g. token recycling) stay warm."""
        return self.drafters.get(DrafterSpec.of(name, options))

    def resolve_drafter(
        self, drafter: DrafterArg, options: Mapping[str, Any] | None = None
    ) -> Drafter:
        """A drafter by name or spec (plus options), an instance as is, or (None) the
        config's."""
        return self.drafters.resolve(drafter, options)

    def kv_prefix(self, rid: int) -> KVPrefix:
        """Where running request ``rid``'s committed KV entries live: its slot in
        ``self.cache`` holds prompt + generated[:-1] (the newest token is fed by the next
        step). A self-draft reads it instead of keeping a cache of its own; it may write
        rows past ``length`` (the step's verification overwrites them) but never commits."""
        req = self.scheduler.running.get(rid)
        if req is None:
            raise KeyError(f"request {rid} is not running")
        return self.cache.prefix(req.slot)

    def recall_view(self, rid: int) -> RecallView:
        """Running request ``rid``'s recall sources: its tenant's response memory (unless
        the engine or the request turned it off) and the ready live corpora. Reads
        immutable snapshots only (``DrafterContext.recall``)."""
        return self._recall.view(self.scheduler.running.get(rid))

    # ---- response memory -------------------------------------------------------------
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The prefix cache's counters (``engine/prefix_cache.py``; None: it is off)."""
        return self.scheduler.stats()

    def memory_stats(self) -> dict[str, Any]:
        """The response memory's use: tokens, segments and mapped bytes per tenant and in
        all, the budget, evictions, build timings; and the live corpora's totals."""
        return self._recall.stats()

    def save_memory(self, path: str | os.PathLike[str] | None = None) -> int:
        """Write every tenant's memory to ``path`` (default: the config's
        ``memory_snapshot``), atomically; returns the file size. Safe while serving."""
        return self._recall.save(path)

    def close(self) -> None:
        """Stop the background threads and free the run-time automata (the engine must
        not be used afterwards)."""
        self.curves.cancel()
        self._recall.close()

    # ---- the online API --------------------------------------------------------------
    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, *,
        drafter: DrafterArg = None, drafter_options: Mapping[str, Any] | None = None,
        mode: str | None = None, sizing: Sizing | None = None,
        request_id: str | None = None, chat: bool = False, arrival: float | None = None,
        tenant: str | None = None, memory: bool = True, prefix_cache: bool = True,
    ) -> int:
        """Queue a request; returns its id (``rid``). Raises ``RecallspecError`` at once
        on bad input (empty or over-long prompt, ids outside the vocabulary, an unknown
        drafter, mode or sizing). ``drafter`` (a registered name with ``drafter_options``,
        a ``DrafterSpec`` or an instance) defaults to the config's; ``mode`` and
        ``sizing`` are a sizing word, "adaptive" or "fixed" (unstated: the config's mode,
        else cost-aware: ``DrafterPool.drafting``); ``chat`` wraps a text prompt
        as one user turn; ``arrival`` (a ``time.perf_counter()`` time, not
        before earlier requests') holds it back until then (offline traffic simulation).
        ``tenant``: requests of one tenant share response memory (None: the anonymous
        partition); ``memory=False``: this request neither drafts from nor feeds it;
        ``prefix_cache=False``: it neither starts from a retained prefix nor leaves one
        (a cold prefill: ``Scheduler.admit``)."""
        if tenant is not None and not isinstance(tenant, str):
            raise DataError("tenant must be a string")
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise DataError("params must be a SamplingParams")
        how = self.drafters.drafting(drafter, drafter_options, mode, sizing)
        ids = self.prompt_ids(prompt, chat=chat)
        constraint = None if params.guide is None else self.guides.compile(
            params.guide, self.tokenizer, vocab_size=int(self.model.config.vocab_size)
        ).matcher()
        if how.sizing == "adaptive":
            # Measured (or read) once, before the request's clock starts (while it is
            # measured in the background: the prior, at once).
            self.curves.current()
        gen = None  # the request's own: one draw per committed token (verify_sampling), so
        if not params.greedy:  # its tokens follow from the seed, whatever batch or drafts
            seed = params.seed if params.seed is not None else torch.seed()
            gen = np.random.default_rng(seed % 2**64)  # (numpy takes no negative seed)
        rid = next(self._rids)
        now = time.perf_counter()
        self.scheduler.add(Request(rid, ids, params, how.drafter, gen, request_id,
                                   arrival=now if arrival is None else arrival,
                                   tenant=tenant or "", use_memory=bool(memory),
                                   use_prefix=bool(prefix_cache), sizing=how.sizing,
                                   constraint=constraint))
        return rid

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    def abort(self, rid: int) -> RequestOutput | None:
        """End a waiting or running request now: its KV slot and drafter state are freed
        before the next step. Returns its last output (reason "abort"), None if ``rid``
        is not waiting or running."""
        req = self.scheduler.get(rid)
        if req is None:
            return None
        req.finish_reason = "abort"
        self._release(req)
        return take_output(req, self.tokenizer.decode)

    def step(self) -> list[RequestOutput]:
        """Admit, draft, run one forward, verify and commit; returns the delta of every
        request that committed tokens or ended in this step (finished ones are freed)."""
        touched: list[Request] = []
        for req in self.scheduler.admit(time.perf_counter()):
            try:
                req.drafter.start(req.rid, req.prompt)
            except Exception as e:
                req.fail(e)
                touched.append(req)
        plan = self.scheduler.schedule()
        if not plan.is_empty:
            touched += plan.requests
            try:
                with torch.inference_mode(), decode_threads(self.threads):
                    self._execute(plan)
            except Exception as e:  # outside any one request's calls: the forward
                for req in plan.requests:
                    if not req.is_finished:
                        req.fail(e)
            except BaseException as e:  # Ctrl-C: leave no request half-stepped
                for req in plan.requests:
                    req.fail(e)
                    self._release(req)
                raise
        outputs = []
        for req in touched:
            if req.is_finished:
                self._recall.remember(req)
                self._release(req)
            if req.is_finished or req.num_committed_out < len(req.generated):
                outputs.append(take_output(req, self.tokenizer.decode))
        return outputs

    # ---- offline ---------------------------------------------------------------------
    @overload
    def generate(
        self, prompts: str | Sequence[int] | Sequence[Mapping[str, Any]],
        params: SamplingParams | None = None, **kw: Any,
    ) -> GenerationResult: ...

    @overload
    def generate(
        self, prompts: list[str] | list[list[int]] | list[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None, **kw: Any,
    ) -> list[GenerationResult]: ...

    def generate(
        self, prompts: Any, params: SamplingParams | Sequence[SamplingParams] | None = None,
        **kw: Any,
    ) -> GenerationResult | list[GenerationResult]:
        """Generate for one prompt or a list of them (``offline.generate``)."""
        return offline.generate(self, prompts, params, **kw)

    def chat(
        self, messages: Any, params: SamplingParams | Sequence[SamplingParams] | None = None,
        **kw: Any,
    ) -> Any:
        """``generate`` for a conversation (a list of {"role", "content"} dicts), a list
        of conversations, or a text taken as one user turn."""
        return offline.generate(self, messages, params, chat=True, **kw)

    # ---- the step --------------------------------------------------------------------
    def _execute(self, plan: StepPlan) -> None:
        """One step through the step core (``step/core.py``), verified by the native
        forward, which also carries the plan's prompt chunks."""
        t_step = time.perf_counter()
        new_before = self.stats.new_tokens
        decoding = list(plan.decoding)
        rooms = [draft_room(self.max_len, self.cache.length(r.slot), self.config.max_draft_nodes)
                 for r in decoding]
        forward_before = self.stats.forward_s
        # A mixture of experts: the experts its verification forward woke, counted in
        # every step without prompt chunks. A step with them is not counted: the routing
        # estimate is one position on anchors at the forward's rows (``cost/experts.py:
        # RoutingEstimate``), and a prompt chunk's rows (up to prefill_chunk) soon wake
        # nearly every expert whatever the routing, where uniform routing and every row
        # fresh experts meet: one expert more or less swings such a reading between
        # those two, and the estimate it would move prices draft rows.
        native = NativeVerifier(self.runner, plan.prefill, self.stats,
                                None if plan.prefill else self._woken)
        out = speculative_step(self.planner, decoding, rooms, native, self._commit)
        if native.experts is not None:
            self.planner.observe_experts(native.result.num_rows, native.experts)
        self.stats.draft_s += out.draft_s
        self.stats.grammar_s += out.grammar_s
        self.stats.grammar_rows += out.grammar_rows
        for c in out.committed:
            record_logprobs(c.seq, c.logits, c.verdict.rows, c.taken, c.masks)
            n_new = len(c.taken)
            c.seq.accept_lengths.append(n_new)
            c.seq.spec.add(n_new, len(c.tree), len(c.verdict.accepted_nodes))
            c.seq.spec.num_forced_tokens += c.forced_accepted
            c.seq.spec.num_cut_tokens += c.cut
            self.stats.forced_tokens += c.forced_accepted
            self.stats.cut_tokens += c.cut
            self.stats.new_tokens += n_new
        for req, e in out.failed:
            req.fail(e)
        for req in self.runner.after_step(native.result.verified):
            self._stop_if_cache_full(req)
        if decoding and not plan.prefill:
            elapsed = time.perf_counter() - t_step
            self.stats.decode_only_s += elapsed
            self.planner.note_step(decoding, native.result.num_rows, elapsed, out.draft_s,
                                   self.curves.known(), self.stats.forward_s - forward_before)
            self.stats.decode_only_tokens += self.stats.new_tokens - new_before
        for req, row in native.result.first_rows:
            mask = None
            try:
                if req.constraint is not None:  # the grammar's mask of the first token
                    mask = req.constraint.constrain(DraftTree.empty(), 0, 0).masks
                first = sample(row, req.params, req.generator,
                               Penalties.of(req.params, req.prompt, ()),
                               None if mask is None else mask[0])
                taken = self._commit(req, [first])
            except Exception as e:
                req.fail(e)
                continue
            record_logprobs(req, row[None], (0,), taken, mask)
            err = tell_drafter(req, taken, DraftTree.empty(), row[None])
            if err is not None:
                req.fail(err)
            req.prefill_time = time.perf_counter() - req.t_start
            req.status = RequestStatus.DECODING

    def _commit(self, req: Request, tokens: list[int]) -> list[int]:
        """Append committed tokens, applying stop conditions, and advance the request's
        grammar over them (every one was chosen under its mask); the tokens taken."""
        taken = commit_tokens(req, tokens, self.tokenizer.eos_token_ids, self.tokenizer.decode)
        if req.constraint is not None and taken:
            try:
                req.constraint.advance(taken)
            except Exception as e:  # a token its mask forbade: a bug, this request's only
                req.fail(e)
        self._stop_if_cache_full(req)
        return taken

    def _stop_if_cache_full(self, req: Request) -> None:
        """End a request whose slot has no room left for its next root row."""
        if req.finish_reason is None and self.cache.length(req.slot) + 1 >= self.max_len:
            req.finish_reason = "context"

    def _release(self, req: Request) -> None:
        """The slot back to the cache, the request out of its drafter."""
        started = req.status is not RequestStatus.WAITING
        self.scheduler.release(req)
        if started:
            with contextlib.suppress(Exception):  # the request is over either way
                req.drafter.stop(req.rid)
