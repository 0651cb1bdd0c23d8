"""Our drafters inside transformers' ``generate``, with tree verification.

Usage (transformers >= 5.x)::

    import recallspec.integrations.hf as rs_hf
    inputs = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    out = model.generate(**inputs, custom_generate=rs_hf.generate, max_new_tokens=128,
                         drafter="sam+recycling", drafter_options={"max_tokens": 16})

transformers calls a callable ``custom_generate`` as ``fn(model, input_ids,
logits_processor=, stopping_criteria=, generation_config=, **model_kwargs)`` after its
own preparation (generation config, max_length, logits processors and warpers, stopping
criteria, attention mask); keyword arguments that ``fn`` names and
``GenerationMixin._sample`` does not - ``drafter``, ``drafter_options``,
``max_draft_nodes`` - pass through from the ``generate`` call.

Each step is one forward of the whole batch: row b feeds its last committed token (the
root) and its drafter's tree, under a 4D additive mask (a node sees the row's cached
text, the root and its own ancestors) with position ids = root position + depth. The
target's logits for every node then decide the accepted path exactly as plain decoding
would (``recallspec.decoding.verify``): greedy output equals ``generate``'s, and sampled
tokens follow the model's distribution after ``logits_processor`` (temperature, top-k,
top-p and any other processor, applied to each node with the node's own context).
The cache keeps the root's and the accepted nodes' entries (``_hf_tree``); rows
accepting different lengths leave holes in the shared cache instead of being padded.

Output: the ``[B, T]`` LongTensor ``generate`` returns: the (left-padded) prompts and
the new tokens, rows that stopped early right-padded with the pad token id (or
``GenerateDecoderOnlyOutput(sequences=...)`` with ``return_dict_in_generate``).
Stopping follows ``generate`` exactly: with an eos criterion a row that meets any
criterion ends and is padded; without one, rows decode on until every row has met one
(``generate`` steps them in lockstep; here they are cut back to that length).

Sliding-window layers get a second mask (``Windows``) whose window counts positions,
so a left-padded row decodes exactly as it would alone; ``generate`` counts cache
columns there, pads included, so for such models padded rows may differ from
``generate``'s (unpadded rows and batch 1 agree).

Requirements and limits: a decoder-only model whose attention takes a 4D additive mask
(``attn_implementation`` "sdpa" or "eager"; flash attention takes no custom mask) and
whose layers are full or sliding-window attention; left padding; no scores,
attentions or hidden states in the output; no streamer. Drafters run on the host
(drafts are token lists); tensors stay on the model's device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from recallspec.decoding.sampling import SamplingParams
from recallspec.decoding.tree import DraftTree
from recallspec.decoding.verify import Verdict, verify_greedy, verify_sampling
from recallspec.drafters import create_drafter
from recallspec.drafters.base import Drafter, checked_instance
from recallspec.integrations import _hf_logits as hl
from recallspec.integrations import _hf_tree as ht
from recallspec.integrations._fingerprint import tokenizer_fingerprint
from recallspec.params import MAX_DRAFT_NODES, Sizing
from recallspec.step.core import Verified, speculative_step
from recallspec.step.planner import DraftPlanner
from recallspec.step.sequence import DraftState

if TYPE_CHECKING:
    from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

__all__ = ["generate", "tokenizer_fingerprint"]

# Drafters that run our own model (they need our engine, which transformers has not).
_ENGINE_ONLY = ("draft-model", "sam+draft-model")
# Compact the cache when this fraction of its columns are holes (gathers once, O(cache)).
_COMPACT_AT = 0.5
_SAMPLE = SamplingParams(temperature=1.0)  # processed scores are already the distribution
# Model kwargs this function handles itself (the rest must be None).
_HANDLED = ("attention_mask", "position_ids", "past_key_values", "use_cache",
            "logits_to_keep", "cache_position")


@dataclass
class _Row:
    """One batch row, a ``StepSequence`` of the step core. Invariant: the drafter's text
    for request ``index`` (the row's index in the input batch and the output) is
    ``text``, the prompt without padding + the committed tokens; the cache holds all of
    it but ``text[-1]``."""

    index: int
    text: list[int]
    drafter: Drafter
    done: bool = False
    sizing: Sizing = "fixed"  # no cost curve for a transformers model: fixed sizes
    draft: DraftState = field(default_factory=DraftState)
    depth_limit: int = 0  # set before each step: tokens the row may still take, - 1
    constraint: None = None  # ``generate`` takes no grammar

    @property
    def rid(self) -> int:
        return self.index

    @property
    def root_pos(self) -> int:
        return len(self.text) - 1

    @property
    def cached_length(self) -> int:
        return len(self.text) - 1


def _windows(config: Any) -> ht.Windows:
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None)
    if types:
        unknown = set(types) - {"full_attention", "sliding_attention"}
        if unknown:
            raise NotImplementedError(
                f"recallspec custom_generate: layer types {sorted(unknown)} are not supported "
                "(only full and sliding-window attention)")
        if "sliding_attention" in types:
            return ht.Windows(sliding=int(window)) if window else ht.Windows()
        return ht.Windows()
    return ht.Windows(full=int(window) if window else None)


def generate(
    model: Any,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    generation_config: GenerationConfig | None = None,
    drafter: str | Drafter = "sam+recycling",
    drafter_options: Mapping[str, Any] | None = None,
    max_draft_nodes: int = MAX_DRAFT_NODES,
    **model_kwargs: Any,
) -> Any:
    """transformers ``custom_generate``: speculative decoding with one of our drafters
    (a registry name with ``drafter_options``, or a drafter instance, which sees request
    ids 0..B-1 for the call's duration) verifying up to ``max_draft_nodes`` tree nodes
    per row and step. See the module docstring."""
    from transformers import GenerationConfig, StoppingCriteriaList

    gc = generation_config or GenerationConfig()
    if getattr(model.config, "is_encoder_decoder", False):
        raise NotImplementedError("recallspec custom_generate: decoder-only models only")
    impl = getattr(model.config, "_attn_implementation", "sdpa")
    if impl not in ("sdpa", "eager"):
        raise NotImplementedError(
            f"recallspec custom_generate: attn_implementation {impl!r} takes no custom 4D "
            "mask; load the model with attn_implementation='sdpa' (or 'eager')")
    for flag in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
        if getattr(gc, flag, False):
            raise NotImplementedError(f"recallspec custom_generate: {flag} is not supported")
    if (getattr(gc, "num_beams", 1) or 1) > 1:
        raise NotImplementedError("recallspec custom_generate: beam search is not supported")
    extra = [k for k, v in model_kwargs.items() if k not in _HANDLED and v is not None]
    if extra:
        raise NotImplementedError(f"recallspec custom_generate: unsupported inputs {extra}")
    cache_in = model_kwargs.get("past_key_values")
    if cache_in is not None and cache_in.get_seq_length() > 0:
        raise NotImplementedError("recallspec custom_generate: cannot continue a given cache")
    if max_draft_nodes < 0:
        raise ValueError("max_draft_nodes must be >= 0")

    attention_mask = model_kwargs.get("attention_mask")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if not bool(attention_mask[:, -1].all()):
        raise ValueError("recallspec custom_generate: use left padding (padding_side='left')")
    stops = hl.Stops(stopping_criteria or StoppingCriteriaList(), int(gc.max_length or 1 << 62))
    pad = gc._pad_token_tensor if getattr(gc, "_pad_token_tensor", None) is not None else None
    pad_id = int(pad) if pad is not None else int(next(iter(stops.eos), 0))

    d = _make_drafter(drafter, drafter_options)
    runner = _Runner(model, d, logits_processor, stops, bool(gc.do_sample), max_draft_nodes)
    try:
        sequences = runner.run(input_ids, attention_mask, pad_id)
    finally:
        runner.stop_all()
    if gc.return_dict_in_generate:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=cast(torch.LongTensor, sequences))
    return sequences


def _make_drafter(drafter: str | Drafter, options: Mapping[str, Any] | None) -> Drafter:
    if not isinstance(drafter, str):
        if options:
            raise ValueError("drafter_options apply to a drafter given by name")
        return checked_instance(drafter)
    if drafter in _ENGINE_ONLY:
        raise ValueError(f"drafter {drafter!r} runs our own model; it needs recallspec's Engine")
    return create_drafter(drafter, **dict(options or {}))


class _Runner:
    """The decoding loop of one ``generate`` call (state: rows, cache, layout)."""

    def __init__(
        self, model: Any, drafter: Drafter, processor: LogitsProcessorList | None,
        stops: hl.Stops, do_sample: bool, max_nodes: int,
    ) -> None:
        self.model, self.drafter, self.processor = model, drafter, processor
        self.row_procs: list[Any] = []
        self.stops, self.do_sample, self.max_nodes = stops, do_sample, max_nodes
        self.planner = DraftPlanner(max_nodes)  # fixed sizing: no cost curve
        self.windows = _windows(model.config)
        # The additive mask's dtype: the model's compute dtype (quantized weights aside).
        dtype = getattr(model, "dtype", torch.float32)
        self.dtype = dtype if dtype.is_floating_point else torch.float32
        self.rows: list[_Row] = []
        self.started: list[int] = []

    def stop_all(self) -> None:
        for rid in self.started:
            self.drafter.stop(rid)
        self.started.clear()

    def run(self, input_ids: torch.Tensor, mask: torch.Tensor, pad_id: int) -> torch.Tensor:
        from transformers import DynamicCache

        b, t = input_ids.shape
        self.pad_id = pad_id
        # The output as generate builds it; grown on demand (max_length may be huge).
        self.out = torch.full((b, t + min(self.stops.max_length - t, 256)), pad_id,
                              dtype=input_ids.dtype, device=input_ids.device)
        self.out[:, :t] = input_ids
        self.length = [t] * b  # output length per row
        self.stop_at: list[int | None] = [None] * b  # length where a criterion first held
        self.limit = self.stops.max_length  # no row grows past this length
        keep = mask.bool()
        self.row_procs = hl.row_processors(self.processor, b)
        for r in range(b):
            text = input_ids[r][keep[r]].tolist()
            self.drafter.start(r, text)
            self.started.append(r)
            self.rows.append(_Row(r, text, self.drafter))
        # The cache: one full-attention DynamicLayer per layer (sliding windows are masks).
        self.cache = DynamicCache()
        # inference_mode for the whole loop: the cache is edited in place between forwards.
        with torch.inference_mode():
            layout = self._prefill(input_ids, keep)
            active = [r for r in self.rows if not self._stopped(r)]
            if len(active) < len(self.rows):
                layout = ht.select_rows(self.cache, layout, [r.index for r in active])
            while active:
                layout = self._step(active, layout)
                self._settle_limit(active)
                still = [i for i, r in enumerate(active) if not r.done]
                if len(still) < len(active):
                    active = [active[i] for i in still]
                    if active:
                        layout = ht.select_rows(self.cache, layout, still)
                if active and layout.length > 64 and ht.holes(layout) > _COMPACT_AT:
                    layout = ht.compact(self.cache, layout)
        return self.out[:, : max(self.length)]

    def _stopped(self, row: _Row) -> bool:
        """A row whose prompt already meets a stopping criterion (max_length <= prompt)."""
        row.done = self.length[row.index] >= self.stops.max_length
        return row.done

    def _settle_limit(self, active: list[_Row]) -> None:
        """Without an eos criterion, ``generate`` does not pad a row that met a
        stopping criterion: every row decodes on, in lockstep, until all have met one.
        Rows here advance at their own pace, so once all have a stop length, the
        batch ends at the largest: longer rows are cut back, shorter ones decode on."""
        if self.stops.pads or any(s is None for s in self.stop_at):
            return
        self.limit = max(s for s in self.stop_at if s is not None)
        for row in active:
            if self.length[row.index] >= self.limit:
                self.length[row.index] = self.limit
                row.done = True

    def _prefill(self, input_ids: torch.Tensor, keep: torch.Tensor) -> ht.Layout:
        """All prompt tokens but the last (each row's first root) into the cache."""
        device = input_ids.device
        pos = (keep.long().cumsum(1) - 1).clamp_min(0)  # generate's position ids
        if input_ids.shape[1] > 1:
            extra = {"logits_to_keep": 1} if self.model._supports_logits_to_keep() else {}
            self.model(input_ids=input_ids[:, :-1], position_ids=pos[:, :-1],
                       attention_mask=None if bool(keep.all()) else keep[:, :-1].long(),
                       past_key_values=self.cache, use_cache=True, **extra)
        return ht.Layout(keep[:, :-1].clone(), pos[:, :-1].clone().to(device))

    def _step(self, active: list[_Row], layout: ht.Layout) -> ht.Layout:
        """One step through the step core (``step/core.py``), verified by one forward
        of the whole batch; then the cache keeps each row's accepted entries."""
        for row in active:  # a deeper path would be cut anyway
            row.depth_limit = self.limit - self.length[row.index] - 1
        verifier = _TreeForward(
            self.model, self.cache, layout, self.dtype, self.windows, self.do_sample,
            {row.index: _Scoring(self.row_procs[row.index],
                                 self.out[row.index : row.index + 1, : self.length[row.index]])
             for row in active})
        out = speculative_step(self.planner, active, [self.max_nodes] * len(active),
                               verifier, self._commit)
        if out.failed:  # no per-row failure here: the call fails
            raise out.failed[0][1]
        # Cached now: the root and the accepted nodes whose successors were taken.
        keep = [[0] + [n + 1 for n in c.verdict.accepted_nodes[: len(c.taken) - 1]]
                for c in out.committed]
        return ht.keep_accepted(self.cache, layout, verifier.qpos, keep)

    def _commit(self, row: _Row, tokens: list[int]) -> list[int]:
        """Append tokens one by one until the row ends; the taken ones. A row ends when
        a stopping criterion first holds if there is an eos criterion (``generate``
        then pads it), else at ``limit`` (``_settle_limit``)."""
        taken: list[int] = []
        o = row.index
        for tok in tokens:
            n = self.length[o]
            if n >= self.out.shape[1]:
                self._grow(n + 1)
            self.out[o, n] = tok
            self.length[o] = n + 1
            taken.append(int(tok))
            if self.stop_at[o] is None and self.stops(self.out[o : o + 1, : n + 1]):
                self.stop_at[o] = n + 1
                if self.stops.pads:
                    row.done = True
                    break
            if n + 1 >= self.limit:
                row.done = True
                break
        row.text.extend(taken)
        return taken

    def _grow(self, need: int) -> None:
        """Widen the output (pad-filled) to at least ``need`` columns."""
        b, have = self.out.shape
        wider = torch.full((b, max(need, 2 * have)), self.pad_id, dtype=self.out.dtype,
                           device=self.out.device)
        wider[:, :have] = self.out
        self.out = wider


@dataclass(frozen=True)
class _Scoring:
    """What a row's verdict reads besides its logits: the row's logits processors and
    its output so far (``[1, n]``: their context)."""

    processors: Any
    prefix: torch.Tensor


class _TreeForward:
    """The ``Verifier`` of one step: one forward of every row's root and tree under a
    4D tree mask (on ``cache`` laid out as ``layout``), each row's logits processed and
    verified as ``generate`` would (``scoring``: by row index)."""

    def __init__(
        self, model: Any, cache: Any, layout: ht.Layout, dtype: torch.dtype,
        windows: ht.Windows, do_sample: bool, scoring: Mapping[int, _Scoring],
    ) -> None:
        self.model, self.cache, self.layout = model, cache, layout
        self.dtype, self.windows = dtype, windows
        self.do_sample, self.scoring = do_sample, scoring
        self.qpos: Any = None  # the step's query positions (``ht.keep_accepted``)

    def verify(
        self, rows: Sequence[_Row], trees: Sequence[DraftTree], masks: Sequence[Any],
    ) -> tuple[list[Verified[_Row]], list[tuple[_Row, Exception]]]:
        """(``masks``: all None, its rows are never constrained.)"""
        inp = ht.step_inputs([row.text[-1] for row in rows], list(trees),
                             [row.root_pos for row in rows], self.layout, self.dtype,
                             self.windows)
        self.qpos = inp.qpos
        out = self.model(input_ids=inp.input_ids, position_ids=inp.position_ids,
                         attention_mask=inp.attention_mask, past_key_values=self.cache,
                         use_cache=True)
        logits = out.logits.float()
        verified = []
        for i, (row, tree) in enumerate(zip(rows, trees, strict=True)):
            row_logits = logits[i, : len(tree) + 1]
            rows_out = row_logits.cpu() if row.drafter.needs_logits else None
            verdict = self._verdict(self.scoring[row.index], tree, row_logits)
            verified.append(Verified(row, tree, verdict, rows_out))
        return verified, []

    def _verdict(self, scoring: _Scoring, tree: DraftTree, logits: torch.Tensor) -> Verdict:
        """The accepted path as ``generate`` would decode it: the row's processors on
        every node's logits, then greedy or sampled acceptance."""
        scores = hl.process(scoring.processors, scoring.prefix, tree, logits)
        if self.do_sample:
            return verify_sampling(tree, scores, _SAMPLE)
        return verify_greedy(tree, scores)
