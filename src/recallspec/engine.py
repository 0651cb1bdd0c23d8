"""The engine: prefill, draft, verify in one ragged forward, commit, repeat.

Every decoding step runs ONE forward over the concatenated rows of all active
sequences (each: its last committed token, the *root*, followed by its draft tree),
with no padding of inputs or KV cache. Each sequence then keeps its own accepted
path; the KV cache compacts that path and every sequence advances by its own count.

Invariant per active sequence: the KV cache slot holds prompt + generated[:-1];
``generated[-1]`` (the root) is committed but not yet cached.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count, pairwise
from typing import Any, overload

import numpy as np
import numpy.typing as npt
import torch

from recallspec.drafters.base import (
    Drafter,
    create_drafter,
    draft_context,
    draft_contexts,
    has_costly_proposals,
)
from recallspec.errors import ContextLengthError, DataError, RecallspecError, ResourceError
from recallspec.runtime.batch import SequenceInput, build_batch
from recallspec.runtime.cost_curve import CostCurve, calibrate
from recallspec.runtime.kv_cache import KVCache, KVPrefix
from recallspec.runtime.linear import forward_threads
from recallspec.runtime.modes import BatchMode, batch_mode
from recallspec.runtime.threads import decode_threads
from recallspec.spec.draft_sizing import AcceptanceStats, choose_draft_sizes
from recallspec.spec.sampling import SamplingParams
from recallspec.spec.tree import DraftTree, limit_depth
from recallspec.spec.verify import Verdict, sample, verify_greedy, verify_sampling

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # path, alias, or None for the default model
    dtype: str = "float32"  # "float32" (token-identical mode) or "bfloat16"
    max_batch_size: int = 1  # sequences decoded together (KV-cache slots)
    max_len: int | None = None  # KV positions per sequence; default min(context, 4096)
    prefill_chunk: int = 512  # prompt tokens per prefill forward
    max_draft_nodes: int = 16  # cap on draft-tree nodes per sequence and step
    threads: int | None = None  # cores for decoding; default torch.get_num_threads()

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.max_batch_size < 1 or self.prefill_chunk < 1 or self.max_draft_nodes < 0:
            raise ValueError("max_batch_size and prefill_chunk must be >= 1, max_draft_nodes >= 0")


@dataclass
class GenerationResult:
    prompt_tokens: int
    token_ids: list[int]  # generated tokens (EOS excluded; cut at a stop string)
    text: str
    finish_reason: str  # "eos" | "length" | "stop" | "context" | "error"
    accept_lengths: list[int]  # committed tokens per decoding step (after the prefill token)
    wall_time: float  # seconds from the request's admission to its end, prefill included
    prefill_time: float
    error: str | None = None  # set (with finish_reason "error") when the request failed
    latency: float = 0.0  # seconds from the request's arrival (or the call) to its end

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def steps(self) -> int:
        return len(self.accept_lengths)

    @property
    def mean_accepted_tokens(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time > 0 else 0.0


@dataclass
class _Request:
    rid: int
    index: int  # position in the caller's list
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    slot: int = -1
    generated: list[int] = field(default_factory=list)  # committed tokens incl. a trailing EOS
    accept_lengths: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    text_cut: int | None = None  # token count kept when a stop string matched
    t_start: float = 0.0
    prefill_time: float = 0.0
    arrival: float = 0.0  # perf_counter time the request arrived
    prefilled: int = 0  # prompt tokens already in the KV cache
    stats: AcceptanceStats | None = None  # adaptive mode: this request's acceptance
    idle_steps: int = 0  # adaptive mode: steps since this request last drafted
    probing: bool = False  # adaptive mode: this step's draft is a forced 1-node probe


@dataclass
class StepStats:
    """Counters of one ``generate`` call (``Engine.stats`` after it returns)."""

    steps: int = 0  # forwards that decoded (verification steps)
    rows: int = 0  # rows fed to those forwards, padding included
    padding_rows: int = 0  # padded input rows (pad_inputs modes)
    kv_padding: int = 0  # padding KV entries written (pad_kv modes)
    draft_nodes: int = 0  # draft nodes verified
    new_tokens: int = 0  # tokens committed by verification steps (first tokens excluded)
    forward_s: float = 0.0  # seconds inside the forwards of those steps
    draft_s: float = 0.0  # seconds proposing and sizing drafts
    prefill_rows: int = 0  # prompt rows fed (alone or inside decoding steps)
    # Steps that decoded and fed no prompt rows: their whole wall time and tokens
    # (the decode phase's throughput, free of the prefill work that every mode shares).
    decode_only_s: float = 0.0
    decode_only_tokens: int = 0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_only_tokens / self.decode_only_s if self.decode_only_s else 0.0

    @property
    def padding_ratio(self) -> float:
        """Padded input rows per committed token (EMS-SD's padding ratio)."""
        return self.padding_rows / self.new_tokens if self.new_tokens else 0.0


Progress = Callable[[int], None]  # called with the number of newly committed tokens
# Adaptive mode: a request not drafting for this many steps drafts 1 node; each rejected
# probe doubles the drafter's wait (up to PROBE_MAX, for all requests: a new request
# would otherwise pay, e.g., a draft model's prompt prefill for a useless first probe),
# an accepted one resets it.
PROBE_EVERY = 8
PROBE_MAX = 128


class Engine:
    """Loads a model once and generates with any registered drafter."""

    def __init__(self, model: Any, tokenizer: Any, config: EngineConfig | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        context = int(model.config.max_position)
        self.context_len = context
        self.max_len = min(context, self.config.max_len or 4096)
        self._check_memory()
        self.cache: KVCache = model.new_cache(self.config.max_batch_size, self.max_len)
        self.stats = StepStats()
        self._cost_curve: CostCurve | None = None
        self._accept_prior: dict[str, AcceptanceStats] = {}
        # Adaptive mode: decayed mean of a decode step's wall time beyond the curve's
        # forward (drafting, verification, bookkeeping); it dilutes the cost of rows.
        self._step_overhead = 0.0
        # Adaptive mode, costly drafters: decayed mean seconds of one draft position.
        self._draft_position_cost = 0.0
        self._probe_wait: dict[str, int] = {}  # adaptive mode: idle steps before a probe
        self._drafters: dict[tuple[str, tuple[tuple[str, Any], ...]], Drafter] = {}
        self._rids = count()
        self._running: dict[int, _Request] = {}  # rid -> request holding a KV slot
        self.threads = self.config.threads or torch.get_num_threads()

    @classmethod
    def load(cls, model: str | None = None, **config: Any) -> Engine:
        from recallspec.models import load_model

        cfg = EngineConfig(model=model, **config)
        m, tok = load_model(model, dtype=DTYPES[cfg.dtype])
        return cls(m, tok, cfg)

    def _check_memory(self) -> None:
        """Refuse a KV cache that does not fit in the memory available now (instead of
        letting the allocation, or the machine, fail later)."""
        c = self.model.config
        dims = [getattr(c, n, None) for n in ("num_layers", "num_kv_heads", "head_dim")]
        if any(not isinstance(x, int) for x in dims):
            return  # not a transformer (test doubles): nothing to account
        need = KVCache.bytes_needed(
            num_layers=int(c.num_layers), num_slots=self.config.max_batch_size,
            max_len=self.max_len, num_kv_heads=int(c.num_kv_heads), head_dim=int(c.head_dim),
            dtype=getattr(self.model, "dtype", torch.float32),
        )
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return
        # Leave room for activations, the drafters and the rest of the process.
        if need > 0.8 * avail:
            per_seq = need / self.config.max_batch_size
            fit = int(0.8 * avail // per_seq)
            raise ResourceError(
                f"a KV cache for max_batch_size={self.config.max_batch_size} x max_len="
                f"{self.max_len} needs {need / 2**30:.1f} GiB but {avail / 2**30:.1f} GiB are "
                f"available; use max_batch_size <= {fit} or a smaller max_len"
            )

    def use_cost_curve(self, curve: CostCurve) -> None:
        """Use this curve for adaptive drafting instead of measuring one (e.g. a curve
        measured by another engine on the same model, or a synthetic one in tests)."""
        self._cost_curve = curve

    def cost_curve(self) -> CostCurve:
        """The verification cost curve of this model on this machine (measured once,
        cached on disk next to the converted model weights)."""
        if self._cost_curve is None:
            from recallspec.models.loader import cache_dir
            from recallspec.runtime.cost_curve import curve_key

            path = cache_dir() / "cost_curves" / f"{curve_key(self)}.json"
            self._cost_curve = calibrate(self, cache_path=path)
        return self._cost_curve

    # ---- prompts and drafters --------------------------------------------
    def encode_prompt(self, prompt: str, *, chat: bool = False) -> list[int]:
        if not prompt:
            raise DataError("empty prompt")
        if chat:
            if not self.tokenizer.has_chat_template:
                raise DataError("this model has no chat template; drop --chat")
            prompt = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True
            )
        return list(self.tokenizer.encode_prompt(prompt))

    def drafter(self, name: str, **options: Any) -> Drafter:
        """The engine's instance of a drafter: kept across requests so that drafters
        with learned state (e.g. token recycling) stay warm."""
        key = (name, tuple(sorted(options.items())))
        if key not in self._drafters:
            d = create_drafter(name, **options)
            # Drafters that run (part of) the target model or check its tokenizer
            # (draft-model, a static SAM index) take what they need from the engine.
            bind = getattr(d, "bind_engine", None)
            if callable(bind):
                bind(self)
            self._drafters[key] = d
        return self._drafters[key]

    # ---- generation ---------------------------------------------------------
    @overload
    def generate(
        self, prompts: str | Sequence[int], params: SamplingParams | None = None, *,
        drafter: str | Drafter = "none", drafter_options: dict[str, Any] | None = None,
        chat: bool = False, progress: Progress | None = None, mode: str | BatchMode = "ems",
        arrivals: Sequence[float] | None = None,
    ) -> GenerationResult: ...

    @overload
    def generate(
        self, prompts: list[str] | list[list[int]] | list[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None, *,
        drafter: str | Drafter = "none", drafter_options: dict[str, Any] | None = None,
        chat: bool = False, progress: Progress | None = None, mode: str | BatchMode = "ems",
        arrivals: Sequence[float] | None = None,
    ) -> list[GenerationResult]: ...

    def generate(
        self,
        prompts: Any,
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        drafter: str | Drafter = "none",
        drafter_options: dict[str, Any] | None = None,
        chat: bool = False,
        progress: Progress | None = None,
        mode: str | BatchMode = "ems",
        arrivals: Sequence[float] | None = None,
    ) -> GenerationResult | list[GenerationResult]:
        """Generate for one prompt (text or token ids) or a list of them.

        A single prompt returns one result and raises on bad input; a list returns a
        result per prompt, in order, where a bad request gets ``finish_reason ==
        "error"`` and the others complete. Up to ``max_batch_size`` requests decode
        together (continuous batching): a waiting request takes a free slot at the next
        step and is prefilled chunk by chunk inside the running batch's forwards.

        ``mode`` picks the batch layout (``runtime/modes.py``: ems, vanilla, unpad-kv,
        unpad-input, adaptive); every mode commits the same tokens. ``arrivals`` (seconds
        after the call, one per prompt) holds each request back until it arrives, to
        simulate online traffic; ``GenerationResult.latency`` counts from the arrival.
        """
        bm = batch_mode(mode)
        single = isinstance(prompts, str) or (
            len(prompts) > 0 and all(isinstance(t, int) for t in prompts)
        )
        plist: list[str | Sequence[int]] = [prompts] if single else list(prompts)
        if not plist:
            return []
        if params is None:
            params = SamplingParams()
        plist_params = (
            [params] * len(plist) if isinstance(params, SamplingParams) else list(params)
        )
        if len(plist_params) != len(plist):
            raise ValueError("need one SamplingParams per prompt")
        if arrivals is not None and (
            len(arrivals) != len(plist) or any(b < a for a, b in pairwise(arrivals))
        ):
            raise ValueError("arrivals must give one non-decreasing time per prompt")
        d = (
            drafter if not isinstance(drafter, str)
            else self.drafter(drafter, **(drafter_options or {}))
        )
        if bm.adaptive:
            self.cost_curve()  # calibrate (or load) before any request's clock starts
        t0 = time.perf_counter()
        self.stats = StepStats()
        results: list[GenerationResult | None] = [None] * len(plist)
        waiting: list[_Request] = []
        for i, (p, sp) in enumerate(zip(plist, plist_params, strict=True)):
            try:
                ids = (
                    self.encode_prompt(p, chat=chat) if isinstance(p, str)
                    else [int(t) for t in p]
                )
                self._check_prompt(ids)
            except RecallspecError as e:
                if single:
                    raise
                results[i] = GenerationResult(0, [], "", "error", [], 0.0, 0.0, error=str(e))
                continue
            gen = None
            if not sp.greedy:
                seed = sp.seed if sp.seed is not None else torch.seed()
                gen = torch.Generator().manual_seed(seed)
            arrival = t0 + (arrivals[i] if arrivals is not None else 0.0)
            waiting.append(_Request(next(self._rids), i, ids, sp, gen, arrival=arrival))
        waiting.reverse()  # pop() admits in the caller's order
        active: list[_Request] = []
        try:
            with torch.inference_mode():
                while waiting or active:
                    now = time.perf_counter()
                    while (
                        waiting and len(active) < self.config.max_batch_size
                        and waiting[-1].arrival <= now
                    ):
                        req = waiting.pop()
                        active.append(req)
                        self._admit(req, d)
                    if not active:  # idle until the next arrival
                        time.sleep(max(waiting[-1].arrival - now, 0.0))
                        continue
                    with decode_threads(self.threads):
                        self._step(active, d, progress, bm)
                    for req in [r for r in active if r.finish_reason is not None]:
                        active.remove(req)
                        results[req.index] = self._finish(req, d)
        finally:
            # On an exception (or Ctrl-C) give every slot back so the engine stays usable.
            for req in active:
                self._release(req, d)
        out = [r for r in results if r is not None]
        assert len(out) == len(plist)
        return out[0] if single else out

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise DataError("empty prompt")
        vocab = int(self.model.config.vocab_size)
        if min(ids) < 0 or max(ids) >= vocab:
            raise DataError(f"prompt token ids must be in [0, {vocab})")
        if len(ids) >= self.context_len:
            raise ContextLengthError(
                f"prompt has {len(ids)} tokens but the model's context is {self.context_len}"
            )
        if len(ids) >= self.max_len:
            raise ContextLengthError(
                f"prompt has {len(ids)} tokens but the KV cache holds {self.max_len} per sequence "
                "(raise max_len)"
            )

    def _admit(self, req: _Request, d: Drafter) -> None:
        """Give the request a slot; its prompt is prefilled by the following steps."""
        req.t_start = time.perf_counter()
        req.slot = self.cache.allocate()
        self._running[req.rid] = req
        d.start(req.rid, req.prompt)

    def _release(self, req: _Request, d: Drafter) -> None:
        """Undo ``_admit``: the slot back to the cache, the request out of the drafter."""
        if req.slot >= 0:
            self.cache.release(req.slot)
            req.slot = -1
            self._running.pop(req.rid, None)
            d.stop(req.rid)

    def kv_prefix(self, rid: int) -> KVPrefix:
        """Where running request ``rid``'s committed KV entries live: its slot in
        ``self.cache`` holds prompt + generated[:-1] (the newest token is fed by the next
        step). A self-draft reads it instead of keeping a cache of its own; it may write
        rows past ``length`` (the step's verification overwrites them) but never commits."""
        try:
            req = self._running[rid]
        except KeyError:
            raise KeyError(f"request {rid} is not running") from None
        return self.cache.prefix(req.slot)

    def _step(
        self, active: list[_Request], d: Drafter, progress: Progress | None, mode: BatchMode
    ) -> None:
        """One forward: every decoding request's root + draft rows (ragged, or padded in
        the padded modes), then prefill chunks of newly admitted requests (at most
        ``prefill_chunk`` prompt tokens per step), so running requests keep decoding."""
        decoding = [r for r in active if r.finish_reason is None and r.prefilled == len(r.prompt)]
        t_step = time.perf_counter()
        new_before = self.stats.new_tokens
        trees = self._drafts(decoding, d, mode) if decoding else []
        t_drafted = time.perf_counter() - t_step
        self.stats.draft_s += t_drafted
        inputs: list[SequenceInput] = []
        pad_to = max((len(t) for t in trees), default=0) if mode.pad_inputs else 0
        n_rows: list[int] = []  # logit rows of each decoding request
        for req, tree in zip(decoding, trees, strict=True):
            start = self.cache.length(req.slot)
            toks = [req.generated[-1], *tree.tokens.tolist()]
            parents = [-1, *(tree.parents + 1).tolist()]
            # Padding rows: leaves below the root, so no real row attends to them.
            pad = max(min(pad_to - len(tree), self.max_len - start - len(toks)), 0)
            toks += [req.generated[-1]] * pad
            parents += [0] * pad
            self.stats.padding_rows += pad
            n_rows.append(len(toks))
            inputs.append(
                SequenceInput(
                    req.slot, start, toks, parents,
                    cache_valid=self.cache.valid_prefix(req.slot),
                    start_pos=self.cache.logical_length(req.slot),
                )
            )
        prefilling: list[tuple[_Request, int]] = []  # (request, tokens fed this step)
        budget = self.config.prefill_chunk
        for req in active:
            if budget <= 0:
                break
            if req.prefilled < len(req.prompt):
                toks = req.prompt[req.prefilled : req.prefilled + budget]
                last = req.prefilled + len(toks) == len(req.prompt)
                inputs.append(
                    SequenceInput(req.slot, req.prefilled, toks, logits="last" if last else "none")
                )
                prefilling.append((req, len(toks)))
                budget -= len(toks)
        meta = build_batch(inputs)
        t_fwd = time.perf_counter()
        with forward_threads(meta.num_tokens, self.threads):
            logits = self.model(meta, self.cache)
        if decoding:
            self.stats.forward_s += time.perf_counter() - t_fwd
            self.stats.steps += 1
            self.stats.rows += meta.num_tokens
        off = 0
        committed: list[int] = []  # KV entries committed per decoding request
        for b, (req, tree) in enumerate(zip(decoding, trees, strict=True)):
            rows = logits[off : off + 1 + len(tree)]
            off += n_rows[b]
            verdict: Verdict = (
                verify_greedy(tree, rows)
                if req.params.greedy
                else verify_sampling(tree, rows, req.params, req.generator)
            )
            keep = [0, *(n + 1 for n in verdict.accepted_nodes)]
            self.cache.commit(req.slot, meta.cache_lens[b], keep)
            committed.append(len(keep))
            if req.stats is not None:
                key = req.stats.key  # the row this draft was sized in
                if req.probing and len(tree):
                    wait = self._probe_wait.get(d.name, PROBE_EVERY)
                    self._probe_wait[d.name] = (
                        PROBE_EVERY if verdict.accepted_nodes else min(2 * wait, PROBE_MAX)
                    )
                req.stats.update(tree.parents, verdict.accepted_nodes)
                self._prior(d).update(tree.parents, verdict.accepted_nodes, key=key)
            self.stats.draft_nodes += len(tree)
            before = len(req.generated)
            self._commit_tokens(
                req, list(verdict.tokens), d, tree, rows if d.needs_logits else None
            )
            n_new = len(req.generated) - before
            req.accept_lengths.append(n_new)
            self.stats.new_tokens += n_new
            if progress:
                progress(n_new)
        if mode.pad_kv and committed:
            # Every slot advances by the batch's largest count; the rest is padding.
            most = max(committed)
            for req, c in zip(decoding, committed, strict=True):
                room = self.max_len - self.cache.length(req.slot) - 1
                n = max(min(most - c, room), 0)
                if n:
                    self.cache.pad(req.slot, n)
                    self.stats.kv_padding += n
                    self._stop_if_cache_full(req)
        self.stats.prefill_rows += sum(n for _, n in prefilling)
        if decoding and not prefilling:
            elapsed = time.perf_counter() - t_step
            self.stats.decode_only_s += elapsed
            if mode.adaptive and self._cost_curve is not None:
                extra = elapsed - self._cost_curve(meta.num_tokens, len(decoding))
                if has_costly_proposals(d):
                    extra -= t_drafted  # priced per draft position instead
                self._step_overhead = max(0.9 * self._step_overhead + 0.1 * extra, 0.0)
            self.stats.decode_only_tokens += self.stats.new_tokens - new_before
        for req, n in prefilling:
            self.cache.commit(req.slot, req.prefilled, range(n))
            req.prefilled += n
            if req.prefilled == len(req.prompt):
                self._first_token(req, d, logits[off], progress)
                off += 1

    def _first_token(
        self, req: _Request, d: Drafter, row: torch.Tensor, progress: Progress | None
    ) -> None:
        first = sample(row, req.params, req.generator)
        row2 = row[None] if d.needs_logits else None
        self._commit_tokens(req, [first], d, DraftTree.empty(), row2)
        req.prefill_time = time.perf_counter() - req.t_start
        if progress:
            progress(1)

    def _drafts(self, decoding: list[_Request], d: Drafter, mode: BatchMode) -> list[DraftTree]:
        """Each decoding request's draft tree, sized by the room left and, in adaptive
        mode, by the cost curve and the request's acceptance statistics: after the
        proposal for cheap drafters, before it for drafters whose proposals cost a model
        forward per draft position (``costly_proposals``)."""
        rooms: list[int] = []
        for req in decoding:
            start = self.cache.length(req.slot)
            # Room for the root row and the draft; no deeper than the tokens still wanted
            # (a deeper accepted path would be cut anyway).
            rooms.append(max(min(self.max_len - start - 1, self.config.max_draft_nodes), 0))
        presize = mode.adaptive and has_costly_proposals(d)
        if presize:
            chains = [np.arange(-1, room - 1, dtype=np.int64) for room in rooms]
            per_node = self._draft_position_cost / max(len(decoding), 1)
            rooms = self._sizes(decoding, d, chains, node_cost=per_node)
        t0 = time.perf_counter()
        batched = getattr(d, "propose_batch", None)
        if callable(batched):
            proposals: list[DraftTree] = batched([r.rid for r in decoding], rooms)
        else:
            proposals = [d.propose(r.rid, room) for r, room in zip(decoding, rooms, strict=True)]
        positions = max((t.depth() for t in proposals), default=0) if presize else 0
        if positions:
            per_position = (time.perf_counter() - t0) / positions
            self._draft_position_cost = 0.8 * self._draft_position_cost + 0.2 * per_position
        trees = []
        for req, tree, room in zip(decoding, proposals, rooms, strict=True):
            want = req.params.max_new_tokens - len(req.generated) - 1
            trees.append(limit_depth(tree.truncate(room), want))
        if not mode.adaptive or presize:
            return trees
        sizes = self._sizes(decoding, d, [t.parents for t in trees])
        return [tree.truncate(k) for tree, k in zip(trees, sizes, strict=True)]

    def _sizes(
        self, decoding: list[_Request], d: Drafter, parents: list[npt.NDArray[np.int64]],
        node_cost: float = 0.0,
    ) -> list[int]:
        """Adaptive mode: how many nodes of each request's (actual or prospective) draft
        tree ``parents`` to verify, maximising the batch's expected tokens per second."""
        curve = self.cost_curve()
        shared = self._prior(d)
        prior = shared.conditional_rates()  # the same for every request this step
        contexts = shared.contexts  # the request stats share the prior's rows
        gains = []
        for req, par in zip(decoding, parents, strict=True):
            if req.stats is None:
                req.stats = AcceptanceStats(self.config.max_draft_nodes, contexts=contexts)
            req.stats.context = draft_context(d, req.rid)
            gains.append(req.stats.node_rates(par, req.stats.conditional_rates(prior)))
        extra = self._step_overhead
        sizes = choose_draft_sizes(
            gains, lambda rows, seqs: curve(rows, seqs) + extra, base_rows=len(decoding),
            node_cost=node_cost,
        )
        for i, (req, par) in enumerate(zip(decoding, parents, strict=True)):
            # Probe now and then: a request that stopped drafting would otherwise never
            # learn that its drafts became good again.
            req.probing = False
            if sizes[i] == 0 and len(par):
                req.idle_steps += 1
                if req.idle_steps >= self._probe_wait.get(d.name, PROBE_EVERY):
                    sizes[i], req.probing = 1, True
            if sizes[i]:
                req.idle_steps = 0
        return sizes

    def _prior(self, d: Drafter) -> AcceptanceStats:
        """Engine-wide acceptance statistics of a drafter (the prior of new requests)."""
        if d.name not in self._accept_prior:  # keyed like _probe_wait
            self._accept_prior[d.name] = AcceptanceStats(
                self.config.max_draft_nodes, decay=0.99, contexts=draft_contexts(d))
        return self._accept_prior[d.name]

    def _commit_tokens(
        self, req: _Request, tokens: list[int], d: Drafter, tree: DraftTree,
        logits: torch.Tensor | None,
    ) -> None:
        """Append committed tokens, applying stop conditions, and tell the drafter."""
        eos = self.tokenizer.eos_token_ids
        taken: list[int] = []
        for t in tokens:
            taken.append(t)
            if t in eos and not req.params.ignore_eos:
                req.finish_reason = "eos"
                break
            if len(req.generated) + len(taken) >= req.params.max_new_tokens:
                req.finish_reason = "length"
                break
        req.generated.extend(taken)
        if req.params.stop and self._hit_stop(req):
            req.finish_reason = "stop"
        self._stop_if_cache_full(req)
        d.observe(req.rid, taken, tree, logits)

    def _stop_if_cache_full(self, req: _Request) -> None:
        """End a request whose slot has no room left for its next root row."""
        if req.finish_reason is None and self.cache.length(req.slot) + 1 >= self.max_len:
            req.finish_reason = "context"

    def _hit_stop(self, req: _Request) -> bool:
        # Decode a tail long enough to contain any stop string plus the new tokens.
        text = self.tokenizer.decode(req.generated)
        return any(s in text for s in req.params.stop)

    def _finish(self, req: _Request, d: Drafter) -> GenerationResult:
        self._release(req, d)
        ids = list(req.generated)
        if req.finish_reason == "eos":
            ids = ids[:-1]
        text = self.tokenizer.decode(ids)
        if req.finish_reason == "stop":
            cut = min((text.find(s) for s in req.params.stop if s in text), default=len(text))
            text = text[:cut]
        return GenerationResult(
            prompt_tokens=len(req.prompt),
            token_ids=ids,
            text=text,
            finish_reason=req.finish_reason or "length",
            accept_lengths=list(req.accept_lengths),
            wall_time=time.perf_counter() - req.t_start,
            prefill_time=req.prefill_time,
            latency=time.perf_counter() - req.arrival,
        )
