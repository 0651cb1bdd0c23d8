"""What the engine hands out, and the text side of committing tokens.

``RequestOutput`` is one request's delta of one step (what a stream sends);
``GenerationResult`` the whole of a finished request; ``StepStats`` the engine's
counters. Text is produced incrementally: each step decodes only a short tail of the
generated tokens, never emits half a UTF-8 character, and holds back the last
``len(longest stop string) - 1`` characters so a stop string split across steps is
never streamed. The concatenated deltas equal ``GenerationResult.text`` (the full
decode, cut before the first stop string) for tokenizers whose decoding of a prefix is
a prefix of the decoding (byte-level BPE; SentencePiece through the offset window).
A request asking for logprobs gets one per committed token (``record_logprobs``), handed
out with its token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch

from recallspec.decoding.logprobs import TokenLogprob, token_logprob
from recallspec.decoding.masks import Mask
from recallspec.engine.request import Request

Decode = Callable[[Sequence[int]], str]


@dataclass
class GenerationResult:
    prompt_tokens: int
    token_ids: list[int]  # generated tokens (EOS excluded; cut at a stop string)
    text: str
    finish_reason: str  # "eos" | "length" | "stop" | "context" | "abort" | "error"
    accept_lengths: list[int]  # committed tokens per decoding step (after the prefill token)
    wall_time: float  # seconds from the request's admission to its end, prefill included
    prefill_time: float
    error: str | None = None  # set (with finish_reason "error") when the request failed
    latency: float = 0.0  # seconds from the request's arrival (or the call) to its end
    cached_tokens: int = 0  # prompt tokens whose KV was reused, not prefilled (prefix cache)
    logprobs: list[TokenLogprob] | None = None  # per token of token_ids (params.logprobs)

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
class StepStats:
    """Engine counters since the last ``generate`` call began (``Engine.stats``)."""

    steps: int = 0  # forwards that decoded (verification steps)
    rows: int = 0  # rows fed to those forwards (a runner's extra rows included)
    draft_nodes: int = 0  # draft nodes verified
    new_tokens: int = 0  # tokens committed by verification steps (first tokens excluded)
    forward_s: float = 0.0  # seconds inside the forwards of those steps
    draft_s: float = 0.0  # seconds proposing and sizing drafts
    prefill_rows: int = 0  # prompt rows fed (alone or inside decoding steps)
    # Steps that decoded and fed no prompt rows: their whole wall time and tokens
    # (the decode phase's throughput, free of the prefill work that every run shares).
    decode_only_s: float = 0.0
    decode_only_tokens: int = 0
    # Under grammars: accepted draft tokens the grammars forced, and drafter nodes they
    # cut before verification.
    forced_tokens: int = 0
    cut_tokens: int = 0
    grammar_s: float = 0.0  # seconds the grammars took in decoding steps (within draft_s)
    grammar_rows: int = 0  # rows they masked

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_only_tokens / self.decode_only_s if self.decode_only_s else 0.0


@dataclass(frozen=True)
class SpecStats:
    """A request's speculation so far (vLLM's spec-decode counters, per request)."""

    num_steps: int  # verification steps
    num_step_tokens: int  # tokens those steps committed (accepted + bonus, after stops)
    num_drafts: int  # steps that verified a non-empty draft
    num_draft_tokens: int  # draft tokens verified
    num_accepted_tokens: int  # draft tokens accepted
    accepted_per_pos: tuple[int, ...]  # [i]: drafts whose accepted path reached depth i + 1
    num_forced_tokens: int = 0  # of the accepted tokens, those a grammar forced
    num_cut_tokens: int = 0  # drafter tokens a grammar cut before verification

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens committed per verification step (1.0 = no speculation gain)."""
        return self.num_step_tokens / self.num_steps if self.num_steps else 0.0

    @staticmethod
    def of(req: Request) -> SpecStats:
        s = req.spec
        return SpecStats(s.num_steps, s.num_step_tokens, s.num_drafts, s.num_draft_tokens,
                         s.num_accepted_tokens, tuple(s.accepted_per_pos),
                         s.num_forced_tokens, s.num_cut_tokens)


@dataclass(frozen=True)
class RequestOutput:
    """One request's delta of one step; the last one has ``finished`` set."""

    rid: int
    request_id: str | None
    new_token_ids: tuple[int, ...]  # committed this step (a final EOS excluded)
    new_text: str  # their text: complete characters, stop strings withheld
    finished: bool
    finish_reason: str | None  # set when finished
    num_prompt_tokens: int
    num_committed: int  # tokens committed this step, a final EOS included
    spec: SpecStats
    error: str | None = None  # finish_reason "error": the message
    exception: BaseException | None = None  # ... and what was raised inside the step
    result: GenerationResult | None = None  # the last output: the whole request
    # Per token of new_token_ids when the request asked for logprobs (else empty).
    new_logprobs: tuple[TokenLogprob, ...] = ()


# ---- committing text ---------------------------------------------------------------
# Tokens the detokenizer's window may span before it slides (a second decode, then): one
# decode per commit otherwise, of a window that stays short.
DETOK_WINDOW = 32


def commit_tokens(
    req: Request, tokens: list[int], eos: Collection[int], decode: Decode,
) -> list[int]:
    """Append committed tokens to ``req`` up to its stop conditions (EOS unless ignored,
    ``max_new_tokens``, a stop string); the tokens taken."""
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
    before = len(req.text)
    extend_text(req, decode)
    if hit_stop(req, before):
        req.finish_reason = "stop"
    return taken


def record_logprobs(
    req: Request, logits: torch.Tensor | None, rows: Sequence[int], taken: Sequence[int],
    masks: Mask | None = None,
) -> None:
    """Append the log-probabilities of committed tokens ``taken`` (token j chosen from
    row ``rows[j]`` of ``logits``: ``Verdict.rows``, masked by ``masks[rows[j]]`` under a
    grammar) when the request asks for them."""
    k = req.params.logprobs
    if k is None:
        return
    assert logits is not None, "the runner keeps the rows of a request asking for logprobs"
    req.logprobs.extend(token_logprob(logits[r], t, k, None if masks is None else masks[r])
                        for r, t in zip(rows, taken, strict=False))


def extend_text(req: Request, decode: Decode) -> None:
    """Append the complete characters of newly committed tokens to ``req.text``: decode
    the window from ``detok_prefix`` (context before ``detok_read``, for tokenizers whose
    pieces depend on the previous token) and keep what follows ``detok_text``, the
    window's old part as decoded by the last call (so one decode per call)."""
    ids = req.generated
    new = decode(ids[req.detok_prefix :])
    if len(new) > len(req.detok_text) and not new.endswith("\ufffd"):  # no half character
        req.text += new[len(req.detok_text) :]
        if len(ids) - req.detok_prefix > DETOK_WINDOW:  # slide: what was read is context
            req.detok_prefix = req.detok_read
            new = decode(ids[req.detok_prefix :])
        req.detok_read, req.detok_text = len(ids), new


def hit_stop(req: Request, before: int) -> bool:
    """Whether a stop string occurs in ``req.text`` ending past character ``before``
    (earlier text was checked when it was committed)."""
    stop = req.params.stop
    if not stop:
        return False
    tail = req.text[max(before - max(len(s) for s in stop) + 1, 0) :]
    return any(s in tail for s in stop)


def final_text(req: Request, decode: Decode) -> str:
    """The whole text of a finished request, cut before the first stop string."""
    text = decode(req.output_ids)
    if req.finish_reason == "stop":
        cut = min((text.find(s) for s in req.params.stop if s in text), default=len(text))
        text = text[:cut]
    return text


def take_output(req: Request, decode: Decode) -> RequestOutput:
    """The request's delta since its last output (and, finished, its result)."""
    num_committed = len(req.generated) - req.num_committed_out
    req.num_committed_out = len(req.generated)
    ids = req.output_ids
    new_ids = tuple(ids[req.num_reported :])
    new_logprobs = tuple(req.logprobs[req.num_reported : len(ids)])
    req.num_reported = len(ids)
    result = None
    if req.is_finished:
        text = final_text(req, decode)
        piece = text[req.text_sent :]
        now = time.perf_counter()
        result = GenerationResult(
            prompt_tokens=len(req.prompt), token_ids=list(ids), text=text,
            finish_reason=req.finish_reason or "length", accept_lengths=list(req.accept_lengths),
            wall_time=now - req.t_start if req.t_start else 0.0, prefill_time=req.prefill_time,
            error=req.error, latency=now - req.arrival, cached_tokens=req.reused,
            logprobs=req.logprobs[: len(ids)] if req.params.logprobs is not None else None,
        )
    else:
        stop = req.params.stop
        hold = max(len(s) for s in stop) - 1 if stop else 0
        end = max(len(req.text) - hold, req.text_sent)
        piece = req.text[req.text_sent : end]
    req.text_sent += len(piece)
    return RequestOutput(
        rid=req.rid, request_id=req.request_id, new_token_ids=new_ids, new_text=piece,
        finished=req.is_finished, finish_reason=req.finish_reason,
        num_prompt_tokens=len(req.prompt), num_committed=num_committed,
        spec=SpecStats.of(req), error=req.error, exception=req.exception, result=result,
        new_logprobs=new_logprobs,
    )
