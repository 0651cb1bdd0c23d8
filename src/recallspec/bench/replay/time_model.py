"""Policy replay's time model: the seconds of a replayed turn, from its steps and the
calibrated cost curve, without running the model.

Under greedy decoding every lossless method commits the AR tokens, so a replayed
policy's steps (``bench/replay/exact.py``: tokens committed, draft rows, cached
context) are the engine's. A turn's seconds are then predicted as

    turn_overhead + prefill_scale * prefill(prompt) + prompt_overhead * prompt tokens
        + sum over steps [ forward_scale * curve(1 + drafted, context) + step_overhead
                           + row_overhead * drafted + the policy's time ]

* ``prefill``: the prompt in ``prefill_chunk``-token chunks, each priced by the curve's
  prefill grid at the position it starts (last row's logits only);
* ``curve(rows, context)``: one verification forward (all rows' logits) after
  ``context`` cached tokens (the curve's decode grid, ``cost/curve.py``);
* the scales, ``step_overhead`` and the per-turn / per-prompt-token terms are fitted
  on the recorded ``ar`` run (``bench/replay/fit.py``): the machine's speed during the
  run against the calibration (a shared VM drifts within minutes), and what a step
  (sampling, commit, detokenising, bookkeeping) and a turn cost beyond the forwards. AR
  has no drafts, so that fit never sees a policy's rows;
* ``row_overhead``: what a draft row costs beyond the curve's price of it (most of it
  in the forwards themselves: a wide verification inside decoding runs slower against
  its calibrated time than a 1-row one; the rest in verification and commit). AR cannot
  show it, so it is fitted on the other recorded drafting methods' runs
  (``bench/replay/fit.py``: each method is predicted with a row term fitted without
  it, so every error tests the model);
* the policy's own time (proposing, sizing, observing): measured while replaying, the
  same Python code the engine runs (``count_policy_time``; off for load-free
  comparisons).

``bench/replay/predict.py`` turns the priced turns into tokens/s as the bench report
does: the mean over questions of each question's tokens / seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import count
from typing import Any

from recallspec.bench.replay.exact import Policy, ReplayConfig, StepRecord, replay_steps
from recallspec.bench.replay.logits import TurnTopk
from recallspec.cost.curve import CostCurve

PREFILL_CHUNK = 512  # EngineConfig.prefill_chunk


@dataclass(frozen=True)
class TimeModel:
    curve: CostCurve
    step_overhead: float = 0.0  # seconds a decoding step takes beyond its forward
    prompt_overhead: float = 0.0  # seconds per prompt token beyond the prefill forwards
    prefill_chunk: int = PREFILL_CHUNK
    count_policy_time: bool = True  # add the policy's measured seconds
    row_overhead: float = 0.0  # seconds a draft row costs beyond the curve's price of it
    forward_scale: float = 1.0  # the run's decode forwards / the curve's
    prefill_scale: float = 1.0  # the run's prefill / the curve's
    turn_overhead: float = 0.0  # seconds per turn beyond prefill and steps

    def prefill(self, prompt_len: int) -> float:
        t, s = 0.0, 0
        while s < prompt_len:
            n = min(self.prefill_chunk, prompt_len - s)
            t += self.curve.prefill_cost(n, s)
            s += n
        return t

    def forwards(self, steps: Sequence[StepRecord]) -> float:
        return sum(self.curve(1 + s.drafted, 1, s.context) for s in steps)

    def turn(self, sim: TurnSim) -> float:
        t = self.turn_overhead + self.prefill_scale * self.prefill(sim.prompt_len)
        t += self.forward_scale * self.forwards(sim.steps)
        t += self.step_overhead * len(sim.steps) + self.prompt_overhead * sim.prompt_len
        t += self.row_overhead * sum(s.drafted for s in sim.steps)
        return t + (sim.policy_s if self.count_policy_time else 0.0)


@dataclass(frozen=True)
class TurnSim:
    prompt_len: int
    new_tokens: int  # generated tokens, EOS excluded (the answer's new_tokens)
    steps: tuple[StepRecord, ...]
    policy_s: float = 0.0  # measured seconds in the policy's calls


def _turns(rec: dict[str, Any]) -> list[tuple[list[int], list[int], bool]]:
    c = rec["choices"][0]
    return [(list(p), list(t), f == "eos")
            for p, t, f in zip(c["prompt_ids"], c["token_ids"], c["finish_reason"], strict=True)]


def simulate(
    records: Sequence[dict[str, Any]], policy: Policy, cfg: ReplayConfig, *,
    warmup: int = 16, topk: dict[str, list[TurnTopk]] | None = None, vocab: int = 0,
) -> dict[str, list[TurnSim]]:
    """question_id -> each turn's simulated steps, questions in record order through ONE
    policy (one engine answers a whole run: its planner's prior carries over).

    ``warmup``: first replay the bench's untimed warm-up, the first question's first turn
    cut to ``warmup`` tokens (0: none), as it too teaches the planner. ``topk``/``vocab``:
    the model's top-k along the answers (``bench/replay/logits.py``)."""
    rids = count()
    eos = records[0].get("eos_token_ids") or [] if records else []
    if warmup and records:
        prompt, toks, _ = _turns(records[0])[0]
        short = replace(cfg, max_new_tokens=min(warmup, cfg.max_new_tokens))
        tk = None if topk is None else topk[str(records[0]["question_id"])][0]
        replay_steps(policy, next(rids), prompt, toks[:warmup], False, eos, short, tk, vocab)
    out: dict[str, list[TurnSim]] = {}
    for rec in records:
        sims = []
        qid = str(rec["question_id"])
        for t, (prompt, toks, hit) in enumerate(_turns(rec)):
            policy.seconds = 0.0  # (``replay_steps`` sums the policy's time)
            tk = None if topk is None else topk[qid][t]
            steps = replay_steps(policy, next(rids), prompt, toks, hit,
                                 rec.get("eos_token_ids") or [], cfg, tk, vocab)
            sims.append(TurnSim(len(prompt), len(toks), tuple(steps), policy.seconds))
        out[str(rec["question_id"])] = sims
    return out


def ar_sims(records: Sequence[dict[str, Any]]) -> dict[str, list[TurnSim]]:
    """The ``ar`` method's own steps (one token each), straight from the answers."""
    out: dict[str, list[TurnSim]] = {}
    for rec in records:
        sims = []
        for prompt, toks, hit in _turns(rec):
            n = len(toks) + int(hit)  # an EOS is committed by a step too
            steps = tuple(StepRecord(1, 0, len(prompt) + j - 1) for j in range(1, n))
            sims.append(TurnSim(len(prompt), len(toks), steps))
        out[str(rec["question_id"])] = sims
    return out
