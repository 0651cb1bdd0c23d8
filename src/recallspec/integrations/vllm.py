"""A vLLM speculative proposer drafting with our suffix automata.

Use::

    vllm serve MODEL --speculative-config '{"method": "custom_class",
        "model": "recallspec.integrations.vllm.SuffixProposer", "num_speculative_tokens": 8}'

vLLM (0.32; ``vllm/v1/spec_decode/custom_class_proposer.py``) constructs the class as
``SuffixProposer(vllm_config)`` in every worker process, calls ``load_model(model)``
once, and each step ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
...)``: for batch row i, ``token_ids_cpu[i, :num_tokens_no_spec[i]]`` is the request's
text (prompt + every token committed so far) and ``sampled_token_ids[i]`` the tokens
committed this step (empty: do not draft for this row, e.g. a chunked prefill). The
answer is one draft chain per row (up to ``num_speculative_tokens`` tokens, may be
empty); vLLM verifies it, so output is unchanged whatever we propose.

Drafts are those of our ``sam`` drafter (``recallspec.drafters.sam``): a dynamic suffix
automaton over the request's own text, and with a corpus index (env
``RECALLSPEC_INDEX``) the static automaton when its match is longer by more than
``delta`` (env ``RECALLSPEC_DELTA``, default 5). The proposer keeps one drafter state
per request text, advanced incrementally by the tokens appended since the last step.

Rows are not requests: vLLM's persistent batch moves requests between rows and reuses
freed rows, and the proposer is given no request ids. So a state is bound to its
*text*, never to a row: a row drafts from a state only if the state's text is a prefix
of the row's current text (checked every step, O(text) memcmp), the state of the same
row last step being tried first; else any pooled state passing the same check (a
request that moved, or a finished one whose whole text opens this one, like the previous
turn of a conversation); else a fresh state built from the row's text. A state serves
one row per step. Equal texts give equal automata, so no row ever drafts from another
request's tokens. States unused for ``RECALLSPEC_IDLE_STEPS`` (default 256) calls are
dropped (a request that ends or is preempted for long only costs a rebuild).

Draft size per request: a chain is cut to ``ceil(spec_factor * L)`` tokens, L the
length of the match it continues (env ``RECALLSPEC_SPEC_FACTOR``, default 1.0; 0 = always
up to ``num_speculative_tokens``), SuffixDecoding's rule: a continuation is trusted about
as far as the context that predicts it. Drafting K tokens after a 1-token match wastes
K verification rows on every request of a full batch; with it vLLM at 18 concurrent
requests no longer loses to no speculation (docs/BENCHMARKS.md).

Scaling: each worker process (tensor / pipeline / data parallel ranks, on any number of
GPUs and nodes) maps the same read-only index file (``mmap``; the OS shares its pages,
nothing is copied per process) and drafts from host memory; all tensor-parallel ranks
compute the same drafts from the same token arrays. This module imports vLLM for types
only, so it imports (and is unit-tested) without vLLM; install recallspec into vLLM's
environment with ``pip install --no-deps`` (its pins are not vLLM's).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from recallspec.decoding.tree import DraftTree
from recallspec.drafters.sam import SamDrafter, SamOptions
from recallspec.integrations._fingerprint import fingerprint_of_dir
from recallspec.recall.automata import StaticIndex

if TYPE_CHECKING:
    from vllm.config import VllmConfig

log = logging.getLogger(__name__)

_PREFIX_CHECK = 16  # tokens compared first when looking for a moved request's state
_EMPTY_TREE = DraftTree.empty()  # observe() of text the proposer did not draft


@dataclass
class _State:
    rid: int  # the drafter's request id
    text: npt.NDArray[np.int64]  # buffer; text[:length] is the state's whole text
    length: int
    last_used: int  # propose() call counter

    def matches(self, tokens: npt.NDArray[Any]) -> bool:
        """Whether this state's text is a prefix of ``tokens``."""
        n = self.length
        if n > tokens.shape[0]:
            return False
        k = min(n, _PREFIX_CHECK)
        if not np.array_equal(self.text[:k], tokens[:k]):
            return False
        return bool(np.array_equal(self.text[:n], tokens[:n]))

    def append(self, tokens: npt.NDArray[Any]) -> None:
        need = self.length + tokens.shape[0]
        if need > self.text.shape[0]:
            grown = np.empty(max(need, 2 * self.text.shape[0]), np.int64)
            grown[: self.length] = self.text[: self.length]
            self.text = grown
        self.text[self.length : need] = tokens
        self.length = need


class SuffixProposer:
    """vLLM ``custom_class`` proposer (see the module docstring)."""

    def __init__(
        self, vllm_config: VllmConfig | None = None, *, num_speculative_tokens: int | None = None,
        max_model_len: int | None = None, index: str | None = None, delta: int | None = None,
        tokenizer_dir: str | None = None, idle_steps: int | None = None,
        spec_factor: float | None = None,
    ) -> None:
        spec = getattr(vllm_config, "speculative_config", None)
        model_cfg = getattr(vllm_config, "model_config", None)
        k = num_speculative_tokens or getattr(spec, "num_speculative_tokens", None)
        if not k or k < 1:
            raise ValueError("SuffixProposer needs num_speculative_tokens >= 1")
        self.k = int(k)
        self.max_model_len = int(max_model_len or getattr(model_cfg, "max_model_len", 0) or 0)
        index = index or os.environ.get("RECALLSPEC_INDEX") or None
        delta = delta if delta is not None else int(os.environ.get("RECALLSPEC_DELTA", "5"))
        self.idle_steps = idle_steps or int(os.environ.get("RECALLSPEC_IDLE_STEPS", "256"))
        if spec_factor is None:
            spec_factor = float(os.environ.get("RECALLSPEC_SPEC_FACTOR", "1.0"))
        if spec_factor < 0:
            raise ValueError("spec_factor (RECALLSPEC_SPEC_FACTOR) must be >= 0")
        self.spec_factor = spec_factor
        static = None
        if index:
            tok_dir = tokenizer_dir or getattr(model_cfg, "tokenizer", None)
            static = _open_index(index, tok_dir)
        opts = SamOptions(index=static.path if static else None, max_tokens=self.k, delta=delta)
        self.drafter = SamDrafter(opts, static)
        self._pool: list[_State] = []
        self._by_row: dict[int, _State] = {}
        self._calls = 0
        self._next_rid = 0

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM hook: no model to load (drafts come from text)."""

    # -- vLLM's entry point ------------------------------------------------------
    def propose(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec: npt.NDArray[Any],
        token_ids_cpu: npt.NDArray[Any], *args: Any, **kwargs: Any,
    ) -> list[list[int]]:
        """One draft chain per row (see the module docstring)."""
        self._calls += 1
        claimed: set[int] = set()  # id() of states serving a row this call
        rows: dict[int, _State] = {}
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            room = self.k if not self.max_model_len else min(self.k, self.max_model_len - n)
            if not len(sampled) or n <= 0 or room <= 0:
                drafts.append([])
                continue
            tokens = token_ids_cpu[i, :n]
            st = self._state_for(i, tokens, claimed)
            claimed.add(id(st))
            rows[i] = st
            drafts.append(self._sized(self.drafter.propose(st.rid, room).tokens.tolist(), st))
        # Rows not drafted this call keep their state as a first guess for the next one.
        self._by_row = {**{i: s for i, s in self._by_row.items() if id(s) not in claimed},
                        **rows}
        self._evict()
        return drafts

    def _sized(self, draft: list[int], st: _State) -> list[int]:
        """``draft`` cut to ``ceil(spec_factor * L)`` tokens (module docstring)."""
        if not draft or self.spec_factor == 0:
            return draft
        step = self.drafter.last_step(st.rid)
        length = step.dynamic_length if step.source == "dynamic" else max(
            step.static_length, step.memory_length)
        return draft[: math.ceil(self.spec_factor * length)]

    # -- states ------------------------------------------------------------------
    def _state_for(self, row: int, tokens: npt.NDArray[Any], claimed: set[int]) -> _State:
        """The state for this row's text, advanced to all of ``tokens``."""
        st = self._by_row.get(row)
        if st is None or id(st) in claimed or not st.matches(tokens):
            st = self._find(tokens, claimed)
        if st is None:
            st = self._new_state(tokens)
        elif st.length < tokens.shape[0]:
            new = np.asarray(tokens[st.length :], np.int64)
            self.drafter.observe(st.rid, new.tolist(), _EMPTY_TREE, None)
            st.append(new)
        st.last_used = self._calls
        return st

    def _find(self, tokens: npt.NDArray[Any], claimed: set[int]) -> _State | None:
        """The pooled, unclaimed state with the longest text that prefixes ``tokens``."""
        best = None
        for st in self._pool:
            if id(st) not in claimed and (best is None or st.length > best.length) \
                    and st.matches(tokens):
                best = st
        return best

    def _new_state(self, tokens: npt.NDArray[Any]) -> _State:
        rid = self._next_rid
        self._next_rid += 1
        text = np.array(tokens, np.int64)
        self.drafter.start(rid, text.tolist())
        st = _State(rid, text, int(text.shape[0]), self._calls)
        self._pool.append(st)
        return st

    def _evict(self) -> None:
        old = [s for s in self._pool if self._calls - s.last_used > self.idle_steps]
        if not old:
            return
        for st in old:
            self.drafter.stop(st.rid)
        gone = {id(s) for s in old}
        self._pool = [s for s in self._pool if id(s) not in gone]
        self._by_row = {i: s for i, s in self._by_row.items() if id(s) not in gone}

    @property
    def n_states(self) -> int:
        return len(self._pool)


def _open_index(path: str, tokenizer_dir: str | None) -> StaticIndex:
    """Map the corpus index, checking it against the served model's tokenizer when the
    tokenizer is a local directory (a hub id is not resolved here: unchecked, logged)."""
    fp = fingerprint_of_dir(tokenizer_dir) if tokenizer_dir and os.path.isdir(tokenizer_dir) \
        else None
    if fp is None:
        log.warning("recallspec: index %s opened without a tokenizer check (no local "
                    "tokenizer.json for %s)", path, tokenizer_dir)
    return StaticIndex.open(path, expected_fingerprint=fp)
