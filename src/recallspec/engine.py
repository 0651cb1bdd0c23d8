"""The engine: prefill, draft, verify in one ragged forward, commit, repeat.

Every decoding step runs ONE forward over the concatenated rows of all active
sequences (each: its last committed token, the *root*, followed by its draft tree),
with no padding of inputs or KV cache. Each sequence then keeps its own accepted
path; the KV cache compacts that path and every sequence advances by its own count.

Invariant per active sequence: the KV cache slot holds prompt + generated[:-1];
``generated[-1]`` (the root) is committed but not yet cached.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any, overload

import torch

from recallspec.drafters.base import Drafter, create_drafter
from recallspec.errors import ContextLengthError, DataError, RecallspecError
from recallspec.runtime.batch import SequenceInput, build_batch
from recallspec.runtime.kv_cache import KVCache
from recallspec.runtime.threads import decode_threads
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


Progress = Callable[[int], None]  # called with the number of newly committed tokens


class Engine:
    """Loads a model once and generates with any registered drafter."""

    def __init__(self, model: Any, tokenizer: Any, config: EngineConfig | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        context = int(model.config.max_position)
        self.context_len = context
        self.max_len = min(context, self.config.max_len or 4096)
        self.cache: KVCache = model.new_cache(self.config.max_batch_size, self.max_len)
        self._drafters: dict[tuple[str, tuple[tuple[str, Any], ...]], Drafter] = {}
        self._rids = count()
        self.threads = self.config.threads or torch.get_num_threads()

    @classmethod
    def load(cls, model: str | None = None, **config: Any) -> Engine:
        from recallspec.models import load_model

        cfg = EngineConfig(model=model, **config)
        m, tok = load_model(model, dtype=DTYPES[cfg.dtype])
        return cls(m, tok, cfg)

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
        return list(self.tokenizer.encode(prompt))

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
        chat: bool = False, progress: Progress | None = None,
    ) -> GenerationResult: ...

    @overload
    def generate(
        self, prompts: list[str] | list[list[int]] | list[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None, *,
        drafter: str | Drafter = "none", drafter_options: dict[str, Any] | None = None,
        chat: bool = False, progress: Progress | None = None,
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
    ) -> GenerationResult | list[GenerationResult]:
        """Generate for one prompt (text or token ids) or a list of them.

        A single prompt returns one result and raises on bad input; a list returns a
        result per prompt, in order, where a bad request gets ``finish_reason ==
        "error"`` and the others complete. Up to ``max_batch_size`` requests decode
        together; a waiting request takes the slot of one that finishes.
        """
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
        d = (
            drafter if not isinstance(drafter, str)
            else self.drafter(drafter, **(drafter_options or {}))
        )
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
            waiting.append(_Request(next(self._rids), i, ids, sp, gen))
        waiting.reverse()  # pop() admits in the caller's order
        active: list[_Request] = []
        try:
            with torch.inference_mode():
                while waiting or active:
                    while waiting and len(active) < self.config.max_batch_size:
                        req = waiting.pop()
                        active.append(req)
                        self._admit(req, d, progress)
                    with decode_threads(self.threads):
                        self._step([r for r in active if r.finish_reason is None], d, progress)
                    for req in [r for r in active if r.finish_reason is not None]:
                        active.remove(req)
                        results[req.index] = self._finish(req, d)
        finally:
            # On an exception (or Ctrl-C) give every slot back so the engine stays usable.
            for req in active:
                if req.slot >= 0:
                    self.cache.release(req.slot)
                    d.stop(req.rid)
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

    def _admit(self, req: _Request, d: Drafter, progress: Progress | None) -> None:
        """Prefill the prompt in chunks and sample the first token."""
        req.t_start = time.perf_counter()
        req.slot = self.cache.allocate()
        chunk = self.config.prefill_chunk
        logits = None
        for start in range(0, len(req.prompt), chunk):
            toks = req.prompt[start : start + chunk]
            last = start + chunk >= len(req.prompt)
            meta = build_batch(
                [SequenceInput(req.slot, start, toks, logits="last" if last else "none")]
            )
            out = self.model(meta, self.cache)
            self.cache.commit(req.slot, start, range(len(toks)))
            if last:
                logits = out[0]
        assert logits is not None
        first = sample(logits, req.params, req.generator)
        d.start(req.rid, req.prompt)
        row = logits[None] if d.needs_logits else None
        self._commit_tokens(req, [first], d, DraftTree.empty(), row)
        req.prefill_time = time.perf_counter() - req.t_start
        if progress:
            progress(1)

    def _step(self, active: list[_Request], d: Drafter, progress: Progress | None) -> None:
        if not active:
            return
        inputs: list[SequenceInput] = []
        trees: list[DraftTree] = []
        for req in active:
            start = self.cache.length(req.slot)
            # Room for the root row and the draft; draft no deeper than the tokens still
            # wanted (a deeper accepted path would be cut anyway).
            room = min(self.max_len - start - 1, self.config.max_draft_nodes)
            want = req.params.max_new_tokens - len(req.generated) - 1
            tree = d.propose(req.rid, max(room, 0)).truncate(max(room, 0))
            tree = limit_depth(tree, want)
            trees.append(tree)
            inputs.append(
                SequenceInput(
                    req.slot,
                    start,
                    [req.generated[-1], *tree.tokens.tolist()],
                    [-1, *(tree.parents + 1).tolist()],
                )
            )
        meta = build_batch(inputs)
        logits = self.model(meta, self.cache)
        for b, (req, tree) in enumerate(zip(active, trees, strict=True)):
            rows = logits[meta.rows(b)]
            verdict: Verdict = (
                verify_greedy(tree, rows)
                if req.params.greedy
                else verify_sampling(tree, rows, req.params, req.generator)
            )
            start = meta.cache_lens[b]
            self.cache.commit(req.slot, start, [0, *(n + 1 for n in verdict.accepted_nodes)])
            before = len(req.generated)
            self._commit_tokens(
                req, list(verdict.tokens), d, tree, rows if d.needs_logits else None
            )
            req.accept_lengths.append(len(req.generated) - before)
            if progress:
                progress(len(req.generated) - before)

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
        if req.finish_reason is None and self.cache.length(req.slot) + 1 >= self.max_len:
            req.finish_reason = "context"
        d.observe(req.rid, taken, tree, logits)

    def _hit_stop(self, req: _Request) -> bool:
        # Decode a tail long enough to contain any stop string plus the new tokens.
        text = self.tokenizer.decode(req.generated)
        return any(s in text for s in req.params.stop)

    def _finish(self, req: _Request, d: Drafter) -> GenerationResult:
        if req.slot >= 0:
            self.cache.release(req.slot)
            d.stop(req.rid)
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
        )
