"""A request's state inside the engine: data, derived properties and a status.

A decoding ``Request`` is the engine's ``step.sequence.StepSequence``.

Invariant while a request holds a KV slot: the slot holds prompt + ``generated[:-1]``;
``generated[-1]`` (the step's *root*) is committed but not yet cached (the next step
feeds it). ``generated`` includes a trailing EOS when one ended the request.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from recallspec.cost.sizing import Sizing
from recallspec.decoding.logprobs import TokenLogprob
from recallspec.decoding.sampling import SamplingParams
from recallspec.drafters.base import Drafter
from recallspec.errors import RecallspecError
from recallspec.step.sequence import Constraint, DraftState

# Why a request ended. The server maps them to OpenAI's: eos/stop -> "stop",
# length/context -> "length".
FINISH_REASONS = ("eos", "length", "stop", "context", "abort", "error")


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # added, no KV slot yet
    PREFILLING = "prefilling"  # holds a slot; prompt chunks still to feed
    DECODING = "decoding"  # prompt cached; each step drafts, verifies, commits
    FINISHED = "finished"  # ended (finish_reason set); slot released


@dataclass
class SpecCounts:
    """Speculation counters of one request, in vLLM's terms: a *draft* is a step that
    verified a non-empty tree; accepted tokens are draft tokens on the accepted path
    (the bonus token is not counted); ``accepted_per_pos[i]``: drafts whose accepted
    path reached depth i + 1."""

    num_steps: int = 0  # verification steps
    num_step_tokens: int = 0  # tokens they committed
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    # Under a grammar: accepted tokens that it forced (drafted by the grammar, not the
    # drafter; among ``num_accepted_tokens``), and drafter nodes it cut before verification.
    num_forced_tokens: int = 0
    num_cut_tokens: int = 0

    def add(self, num_committed: int, num_draft_tokens: int, num_accepted: int) -> None:
        """One verification step: tokens it committed, draft size, accepted nodes."""
        self.num_steps += 1
        self.num_step_tokens += num_committed
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_accepted:
            self.accepted_per_pos.extend([0] * (num_accepted - len(self.accepted_per_pos)))
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1


@dataclass(eq=False)  # identity: requests are compared as objects, never by value
class Request:
    rid: int  # the engine's id
    prompt: list[int]
    params: SamplingParams
    drafter: Drafter
    generator: np.random.Generator | None  # sampling only (decoding.sampling.Rng)
    request_id: str | None = None  # the caller's id
    arrival: float = 0.0  # perf_counter time it may be admitted (offline arrivals)
    status: RequestStatus = RequestStatus.WAITING
    slot: int = -1
    prefilled: int = 0  # prompt tokens already in the KV cache
    reused: int = 0  # of them, tokens whose KV a previous request left (prefix cache)
    generated: list[int] = field(default_factory=list)  # committed tokens incl. a final EOS
    # With ``params.logprobs``: one per token of ``generated``, in order (empty otherwise).
    logprobs: list[TokenLogprob] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)  # tokens per verification step
    finish_reason: str | None = None
    error: str | None = None  # finish_reason "error": what went wrong
    exception: BaseException | None = None  # ... and the exception itself
    t_start: float = 0.0  # admission time
    prefill_time: float = 0.0  # admission to the first token
    draft: DraftState = field(default_factory=DraftState)
    spec: SpecCounts = field(default_factory=SpecCounts)
    # Output bookkeeping (``outputs.take_output``): text and tokens handed out so far.
    num_reported: int = 0  # output_ids already in an output
    num_committed_out: int = 0  # generated (EOS included) already counted in an output
    text: str = ""  # incremental text of ``generated`` (complete characters only)
    text_sent: int = 0  # characters of ``text`` already in an output
    detok_prefix: int = 0  # incremental detokenizer offsets into ``generated``
    detok_read: int = 0
    detok_text: str = ""  # decode(generated[detok_prefix:detok_read]), kept from the last call
    # Response memory: the partition it reads and feeds ("" = the anonymous one), and
    # whether it uses the memory at all (it still sees the live corpora).
    tenant: str = ""
    use_memory: bool = True
    # Whether it takes part in prefix reuse (``prefix_cache.py``): False, it starts from
    # an empty slot, leaves nothing retained and lends its rows to nobody (a cold
    # prefill, as a benchmark that times one method against another needs).
    use_prefix: bool = True
    # How its drafts are sized (``cost/sizing.py``). The engine always states it
    # (``DrafterPool.drafting``); "fixed" for requests built by hand (tests, replay).
    sizing: Sizing = "fixed"
    # Its grammar's state after ``generated`` (``params.guide``'s matcher; None: free).
    constraint: Constraint | None = None

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def depth_limit(self) -> int:
        """The deepest draft worth verifying (``StepSequence``): the tokens still
        wanted, less the bonus token."""
        return self.params.max_new_tokens - len(self.generated) - 1

    @property
    def cached_length(self) -> int:
        """Tokens in its KV slot while decoding (``StepSequence``): prompt +
        generated[:-1]."""
        return len(self.prompt) + len(self.generated) - 1

    @property
    def is_prefilled(self) -> bool:
        return self.prefilled == len(self.prompt)

    @property
    def output_ids(self) -> list[int]:
        """Generated tokens as the caller sees them: without a final EOS."""
        return self.generated[:-1] if self.finish_reason == "eos" else self.generated

    def fail(self, error: BaseException) -> None:
        """End the request with an error (whatever else ended it)."""
        self.finish_reason, self.exception = "error", error
        msg = str(error)
        self.error = msg if isinstance(error, RecallspecError) and msg else (
            f"{type(error).__name__}: {msg}" if msg else type(error).__name__)
