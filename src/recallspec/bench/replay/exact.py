"""Exact offline acceptance replay of model-free drafters against recorded ``ar`` answers.

Under greedy decoding every lossless method commits exactly the AR tokens, so for a
drafter that needs no model logits the per-step accept lengths follow from the AR
output alone (teacher forcing). ``replay_steps`` runs the engine's own step code
(``step/core.py: speculative_step``, with the same planner, room and depth limit) with
a teacher-forced ``Verifier`` (``TeacherForced``): the accepted path = the longest tree
path matching the next AR tokens, plus the bonus token (the next AR token), cut at EOS
or the length cap as the engine cuts it. A ``Policy`` says how a request drafts (a
drafter and its sizing); ``replay_steps`` records each step's draft size and context:
what ``bench/replay/time_model.py`` prices.

Exactness assumes the AR output is what the model's argmax gives on the tree rows too
(true up to floating-point ties/rounding between a 1-row and a k-row forward).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import count
from pathlib import Path
from typing import Any

import torch

from recallspec.bench.common.answers import read_answers
from recallspec.bench.common.report import num
from recallspec.bench.replay.logits import TurnTopk, committed_logits
from recallspec.cost.sizing import draft_room
from recallspec.decoding.tree import DraftTree
from recallspec.decoding.verify import Verdict
from recallspec.drafters.base import Drafter
from recallspec.drafters.registry import create_drafter
from recallspec.errors import DataError
from recallspec.markdown import table
from recallspec.params import DEFAULT_SIZING, MAX_DRAFT_NODES, Sizing
from recallspec.step.core import Verified, speculative_step, tell_drafter
from recallspec.step.planner import DraftPlanner
from recallspec.step.sequence import DraftState


@dataclass(frozen=True)
class ReplayConfig:
    max_new_tokens: int
    max_draft_nodes: int = MAX_DRAFT_NODES  # EngineConfig.max_draft_nodes
    max_len: int = 4096  # KV positions per sequence (Engine.max_len)
    # How a method named without a sizing is sized: what it meant where its answers were
    # recorded (``bench/common/method.py``'s ``recorded_sizing_default`` of the run.json).
    sizing_default: Sizing = DEFAULT_SIZING


def accepted_nodes(
    tree: DraftTree, target: Sequence[int], final_any: frozenset[int] = frozenset()
) -> list[int]:
    """The nodes of the longest root-to-node path whose tokens are a prefix of
    ``target``, root side first.

    Siblings carry distinct tokens, so the walk is unique: at each node, the child
    whose token is the next target token. ``final_any``: any of these ids matches the
    last target position (an EOS whose exact id the answer file does not record).
    """
    children = tree.children()
    toks = tree.tokens.tolist()
    node, path = -1, list[int]()
    last = len(target) - 1
    while len(path) < len(target):
        n = len(path)
        ok = final_any if (n == last and final_any) else (target[n],)
        nxt = next((c for c in children[node + 1] if toks[c] in ok), None)
        if nxt is None:
            break
        node = nxt
        path.append(nxt)
    return path


def accepted_path(
    tree: DraftTree, target: Sequence[int], final_any: frozenset[int] = frozenset()
) -> int:
    """Length of the longest root-to-node path whose tokens are a prefix of ``target``."""
    return len(accepted_nodes(tree, target, final_any))


@dataclass(frozen=True)
class StepRecord:
    """One replayed verification step."""

    committed: int  # tokens it committed: accepted draft tokens + the bonus token
    drafted: int  # draft nodes verified (the forward has 1 + drafted rows)
    context: int  # tokens cached before it (prompt + committed so far - 1)


# What replay knows of a verification's logits: the committed path as a chain and its
# rows' logits (``bench/replay/logits.py``), for drafters that learn from logits.
Known = tuple[DraftTree, torch.Tensor]


class Policy:
    """How a replayed request drafts: a drafter, its sizing and the planner that drafts
    for it (one planner for a whole replayed run, as one engine serves a run).
    ``seconds``: time spent in the drafter and the planner, summed by ``replay_steps``."""

    def __init__(self, name: str, drafter: Drafter, sizing: Sizing, planner: DraftPlanner,
                 ) -> None:
        self.name, self.drafter, self.sizing, self.planner = name, drafter, sizing, planner
        self.seconds = 0.0

    def foresee(self, future: Sequence[int], final_any: frozenset[int], depth: int) -> None:
        """The tokens the next step will commit (``accepted_nodes``' arguments) and its
        depth limit: for oracles only; a real policy does not look."""


class FixedPolicy(Policy):
    """A drafter's proposal cut only to the room (the engine's fixed sizing)."""

    def __init__(self, drafter: Drafter, name: str | None = None) -> None:
        super().__init__(name or drafter.name, drafter, "fixed", DraftPlanner(MAX_DRAFT_NODES))


@dataclass
class _Turn:
    """A replayed answer as the step core's ``StepSequence``."""

    rid: int
    drafter: Drafter
    sizing: Sizing
    draft: DraftState = field(default_factory=DraftState)
    depth_limit: int = 0  # both set before each step
    cached_length: int = 0
    constraint: None = None  # recorded answers are replayed unconstrained


class TeacherForced:
    """The replay's ``Verifier``: the accepted path is the longest tree path that the
    recorded answer continues (``accepted_nodes``), followed by the next recorded token;
    ``known`` gives the committed rows' logits where the answers' top-k is known."""

    def __init__(self, future: Sequence[int], final_any: frozenset[int],
                 known: Callable[[list[int]], Known | None]) -> None:
        self.future, self.final_any, self.known = future, final_any, known
        self.seconds = 0.0

    def verify(
        self, seqs: Sequence[_Turn], trees: Sequence[DraftTree], masks: Sequence[Any],
    ) -> tuple[list[Verified[_Turn]], list[tuple[_Turn, Exception]]]:
        """(``masks``: all None, replays are unconstrained.)"""
        t0 = time.perf_counter()
        out = []
        for seq, tree in zip(seqs, trees, strict=True):
            path = accepted_nodes(tree, self.future, self.final_any)
            # The bonus token is the next AR token; when the path reaches the end of the
            # output, that end is an EOS (the depth limit keeps paths inside the length
            # cap) and the engine stops right after committing it.
            tokens = tuple(self.future[: min(len(path) + 1, len(self.future))])
            seen = self.known(list(tokens[: len(path)]))
            out.append(Verified(seq, tree, Verdict(tuple(path), tokens), None, seen))
        self.seconds += time.perf_counter() - t0
        return out, []


def replay_steps(
    policy: Policy, rid: int, prompt: Sequence[int], output: Sequence[int], eos_hit: bool,
    eos_ids: Sequence[int], cfg: ReplayConfig, topk: TurnTopk | None = None, vocab: int = 0,
) -> list[StepRecord]:
    """The steps the engine would run for ``policy`` on this AR turn.

    ``output`` is the AR turn's generated ids without EOS; ``eos_hit`` says the turn
    ended on EOS (one of ``eos_ids``), which the engine commits as a token and stops.
    ``topk``/``vocab``: the model's top-k along the turn (``bench/replay/logits.py``),
    for policies whose drafter learns from logits.
    """
    full = [int(t) for t in output]
    final_any: frozenset[int] = frozenset()
    if eos_hit:
        if not eos_ids:
            raise DataError("an answer ended on EOS but the EOS ids are unknown")
        final_any = frozenset(int(e) for e in eos_ids)
        full.append(min(final_any))
    if not full:
        return []

    def known(start: int, path_tokens: list[int]) -> Known | None:
        if topk is None:
            return None
        rows = topk[start : start + len(path_tokens) + 1]
        # A path that reaches the turn's last token has no row after it in the answer
        # (the turn ends there): that last node's row is left out.
        return committed_logits(path_tokens[: len(rows) - 1], rows, vocab)

    def commit(seq: _Turn, tokens: list[int]) -> list[int]:
        return tokens  # the verdict holds only recorded tokens, cut at the answer's end

    seq = _Turn(rid, policy.drafter, policy.sizing)
    t0 = time.perf_counter()
    committed = 1  # the prefill samples full[0]
    policy.drafter.start(rid, list(prompt))
    err = tell_drafter(seq, [full[0]], DraftTree.empty(), None, known(0, []))
    steps: list[StepRecord] = []
    try:
        if err is not None:
            raise err
        while committed < len(full):
            seq.cached_length = len(prompt) + committed - 1  # prompt + committed[:-1]
            seq.depth_limit = cfg.max_new_tokens - committed - 1
            room = draft_room(cfg.max_len, seq.cached_length, cfg.max_draft_nodes)
            future = full[committed:]
            policy.foresee(future, final_any, seq.depth_limit)
            verifier = TeacherForced(future, final_any, partial(known, committed))
            out = speculative_step(policy.planner, [seq], [room], verifier, commit)
            t0 -= verifier.seconds  # (teacher forcing is not the policy's time)
            if out.failed:
                raise out.failed[0][1]
            take = len(out.committed[0].taken)
            steps.append(StepRecord(take, len(out.committed[0].tree), seq.cached_length))
            committed += take
    finally:
        policy.drafter.stop(rid)
        policy.seconds += time.perf_counter() - t0
    return steps


def replay_turn(
    drafter: Drafter, rid: int, prompt: Sequence[int], output: Sequence[int], eos_hit: bool,
    eos_ids: Sequence[int], cfg: ReplayConfig,
) -> list[int]:
    """Accept lengths the engine would record for ``drafter`` on this AR turn (fixed
    mode; see ``replay_steps``)."""
    steps = replay_steps(FixedPolicy(drafter), rid, prompt, output, eos_hit, eos_ids, cfg)
    return [s.committed for s in steps]


def replay_answers(
    records: Sequence[dict[str, Any]], method: str, cfg: ReplayConfig,
    drafter_options: dict[str, Any] | None = None,
) -> dict[str, list[int]]:
    """question_id -> replayed accept lengths (all turns, concatenated)."""
    drafter = create_drafter(method, **(drafter_options or {}))
    if drafter.needs_logits:
        raise DataError(f"drafter {method!r} needs model logits and cannot be replayed offline")
    rids = count()
    out: dict[str, list[int]] = {}
    for rec in records:
        c = rec["choices"][0]
        prompts = c.get("prompt_ids")
        if prompts is None:
            raise DataError(
                f"answer for question {rec['question_id']} has no prompt_ids (written by an "
                "older version?); re-run the ar method"
            )
        eos = rec.get("eos_token_ids") or []
        acc: list[int] = []
        for p, toks, fin in zip(prompts, c["token_ids"], c["finish_reason"], strict=True):
            acc += replay_turn(drafter, next(rids), p, toks, fin == "eos", eos, cfg)
        out[str(rec["question_id"])] = acc
    return out


def load_ar_answers(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Records of an ``ar`` answer file and the run settings next to it (may be {})."""
    recs = read_answers(path)
    if not recs:
        raise DataError(f"{path} holds no answers")
    bad = [r for r in recs if r.get("method", "ar") != "ar"]
    if bad:
        raise DataError(
            f"{path}: replay needs answers of the ar method, found {bad[0]['method']!r}"
        )
    settings: dict[str, Any] = {}
    run = path.parent.parent / "run.json"
    if run.is_file():
        settings = json.loads(run.read_text(encoding="utf-8")).get("settings", {})
    if settings.get("temperature", 0.0) != 0.0:
        raise DataError("replay is exact only for greedy (temperature 0) ar answers")
    return recs, settings


def replay_report(
    records: Sequence[dict[str, Any]], replayed: dict[str, dict[str, list[int]]],
) -> dict[str, Any]:
    """{method: {category | "overall": {"mat", "steps", "questions"}}}."""
    cats: list[str] = []
    for r in records:
        if r["category"] not in cats:
            cats.append(r["category"])
    rep: dict[str, Any] = {}
    for m, acc in replayed.items():
        per: dict[str, Any] = {}
        for cat in [*cats, "overall"]:
            qids = [str(r["question_id"]) for r in records if cat in ("overall", r["category"])]
            pooled = [a for q in qids for a in acc[q]]
            per[cat] = {
                "questions": len(qids), "steps": len(pooled),
                "mat": statistics.fmean(pooled) if pooled else None,
            }
        rep[m] = per
    return rep


def render_replay_markdown(rep: dict[str, Any]) -> str:
    methods = list(rep)
    if not methods:
        return ""
    rows = [[c, *(num(rep[m][c]["mat"], ".3f") for m in methods)] for c in rep[methods[0]]]
    return table(["category", *(f"{m} MAT" for m in methods)], rows) + "\n"
