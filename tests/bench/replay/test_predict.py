"""Policy replay with time prediction (bench/replay/predict.py, replay_policies.py) and the
context-aware cost curve it prices steps with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import FoldedByteTokenizer, needs_model
from helpers.replay import V, cycle_model, grid_curve

from recallspec.bench.replay.exact import FixedPolicy, ReplayConfig, StepRecord, replay_steps
from recallspec.bench.replay.fit import fit_row_overhead, fit_time_model
from recallspec.bench.replay.policies import AdaptivePolicy, OraclePolicy, make_policy
from recallspec.bench.replay.predict import predict
from recallspec.bench.replay.time_model import TimeModel, TurnSim, ar_sims, simulate
from recallspec.cli import main
from recallspec.cost.curve import CostCurve, CostGrid
from recallspec.decoding.sampling import SamplingParams
from recallspec.decoding.tree import DraftTree
from recallspec.drafters import Drafter, create_drafter
from recallspec.engine import Engine, EngineConfig, GenerationResult
from recallspec.step.planner import DraftPlanner

EOS = 0


# ---- the cost curve --------------------------------------------------------------------


def test_cost_grid_is_bilinear_and_extrapolates() -> None:
    c = grid_curve()
    assert c(4, 1, 100) == pytest.approx(1.0 + 0.3 + 0.4)
    assert c(6, 1, 550) == pytest.approx(1.0 + 0.5 + 0.001 * 550 * 6)  # inside: exact
    assert c(4, 1, 2000) == pytest.approx(1.0 + 0.3 + 0.001 * 2000 * 4)  # beyond: linear
    assert c(4) == pytest.approx(1.0 + 0.3 + 0.256 * 4)  # no context: the reference curve
    assert c(0, 1, 100) == c(1, 1, 100)  # fewer rows than measured cost no less
    rows = np.arange(1, 60, dtype=np.float64)
    for ctx in (None, 0, 50, 700, 3000):
        assert np.allclose(c.costs(rows, 2, ctx), [c(int(r), 2, ctx) for r in rows])
    at0, at512 = 0.5 + 1.5 * 255 / 511, 1.0 + 2.0 * 255 / 511  # 256 rows, two contexts
    assert c.prefill_cost(256, 256) == pytest.approx((at0 + at512) / 2)


def test_cost_curve_json_round_trip_and_format() -> None:
    c = grid_curve()
    assert CostCurve.from_json(json.loads(json.dumps(c.to_json()))) == c
    old = {"format": 2, "tokens": [1, 2], "seconds": [1.0, 2.0], "per_seq": 0.0}
    with pytest.raises(ValueError, match="format"):
        CostCurve.from_json(old)
    with pytest.raises(ValueError):
        CostGrid((1, 2), (0,), ((1.0,),))


def test_a_curve_measured_while_busy_stands_in_but_is_never_cached(tmp_path: Path) -> None:
    """Busy: measured once, kept in a provisional file that later busy calls reuse (no
    new measurement per engine); quiet: measured again and cached for good."""
    from recallspec.cost import calibration as cc

    calls = []

    class Counting:  # counts forwards, to tell a measurement from a read
        def __init__(self, model: Any) -> None:
            self.model = model
            self.config = model.config

        def new_cache(self, *a: Any) -> Any:
            return self.model.new_cache(*a)

        def __call__(self, *a: Any) -> Any:
            calls.append(1)
            return self.model(*a)

    model = Counting(cycle_model(7))
    path = tmp_path / "curve.json"
    kw: dict[str, Any] = {"key": "k", "cache_path": path, "contexts": False, "repeats": 1}
    busy = cc.calibrate(model, 1, busy=lambda: True, **kw)
    assert not path.exists() and path.with_suffix(".busy.json").is_file() and calls
    calls.clear()
    assert cc.calibrate(model, 1, busy=lambda: True, **kw) == busy and not calls
    assert cc.calibrate(model, 1, busy=lambda: True, **(kw | {"key": "other"})) != busy
    calls.clear()
    quiet = cc.calibrate(model, 1, busy=lambda: False, **kw)  # quiet: measured again
    assert calls and path.is_file() and not path.with_suffix(".busy.json").exists()
    calls.clear()
    assert cc.calibrate(model, 1, busy=lambda: True, **kw) == quiet and not calls


def test_a_curve_whose_grid_disagrees_is_not_kept() -> None:
    """A decode grid that disagrees with the reference forwards (the machine's speed
    changed while measuring) is not cached for good, nor trusted when read back."""
    from recallspec.cost.cache import GRID_AGREEMENT, grid_agrees

    sizes = (1, 2, 4, 8, 16)
    ref = tuple(0.004 + 0.0005 * n for n in sizes)

    def curve(scale: float) -> CostCurve:
        rows = tuple(tuple(scale * t * (1 + c / 4096) for t in ref) for c in (128, 512, 2048))
        return CostCurve(sizes, ref, 0.0, "k", CostGrid(sizes, (128, 512, 2048), rows))

    assert grid_agrees(curve(1.0)) and grid_agrees(curve(0.8))
    assert not grid_agrees(curve(GRID_AGREEMENT * 1.7))  # 2.5x: the curve of 2026-11-28
    assert not grid_agrees(curve(1 / (GRID_AGREEMENT * 1.2)))


# ---- the time model ------------------------------------------------------------------


def test_time_model_prices_prefill_chunks_and_steps() -> None:
    c = grid_curve()
    tm = TimeModel(c, step_overhead=0.01, prompt_overhead=0.001, prefill_chunk=512)
    # 700 prompt tokens: a 512-row chunk at 0, a 188-row chunk at 512.
    assert tm.prefill(700) == pytest.approx(c.prefill_cost(512, 0) + c.prefill_cost(188, 512))
    steps = (StepRecord(3, 4, 700), StepRecord(1, 0, 703))
    sim = TurnSim(700, 4, steps, policy_s=0.5)
    want = tm.prefill(700) + c(5, 1, 700) + c(1, 1, 703) + 2 * 0.01 + 0.7 + 0.5
    assert tm.turn(sim) == pytest.approx(want)
    assert TimeModel(c, count_policy_time=False).turn(sim) == pytest.approx(
        tm.prefill(700) + c(5, 1, 700) + c(1, 1, 703))


def _ar_records(model: Any, prompts: list[list[int]], max_new: int,
                wall: Any = None) -> list[dict[str, Any]]:
    eng = Engine(model, FoldedByteTokenizer(V), EngineConfig(max_len=512))
    recs: list[dict[str, Any]] = []
    for i, p in enumerate(prompts):
        r = eng.generate(p, SamplingParams(max_new_tokens=max_new), drafter="none")
        assert isinstance(r, GenerationResult)
        rec: dict[str, Any] = {"question_id": i, "category": "even" if i % 2 == 0 else "odd",
               "eos_token_ids": [EOS], "choices": [{
                   "prompt_ids": [p], "token_ids": [r.token_ids],
                   "finish_reason": [r.finish_reason], "new_tokens": [len(r.token_ids)],
                   "wall_time": [0.0]}]}
        recs.append(rec)
    if wall is not None:
        for rec, sims in zip(recs, ar_sims(recs).values(), strict=True):
            rec["choices"][0]["wall_time"] = [wall(s) for s in sims]
    return recs


def _prompts(seed: int, n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, V, (int(torch.randint(5, 60, (1,), generator=g)),),
                          generator=g).tolist() for _ in range(n)]


def test_fit_recovers_overheads_despite_a_disturbed_turn() -> None:
    c = grid_curve()
    truth = TimeModel(c, step_overhead=0.02, prompt_overhead=0.003, count_policy_time=False)
    recs = _ar_records(cycle_model(1), _prompts(1, 12), 30, wall=truth.turn)
    recs[3]["choices"][0]["wall_time"][0] *= 3  # another job slowed this turn
    tm, fit = fit_time_model(c, recs)
    assert tm.step_overhead == pytest.approx(0.02, rel=1e-3)
    assert tm.prompt_overhead == pytest.approx(0.003, rel=1e-3)
    assert fit["disturbed"] == 1


def test_fit_reads_the_recorded_split_of_each_turn() -> None:
    """With the engine's split recorded (forward seconds, decode wall), the run's speed
    against the curve and the step, prefill and per-turn terms are recovered."""
    c = grid_curve()
    truth = TimeModel(c, step_overhead=0.02, count_policy_time=False, forward_scale=1.2,
                      prefill_scale=1.1, turn_overhead=0.05)
    recs = _ar_records(cycle_model(2), _prompts(2, 12), 30)
    for rec, sims in zip(recs, ar_sims(recs).values(), strict=True):
        ch = rec["choices"][0]
        ch["timing"] = [{"steps": len(s.steps), "rows": len(s.steps), "draft_s": 0.0,
                         "forward_s": 1.2 * truth.forwards(s.steps),
                         "decode_s": truth.forward_scale * truth.forwards(s.steps)
                         + 0.02 * len(s.steps)} for s in sims]
        ch["wall_time"] = [truth.turn(s) for s in sims]
        ch["wall_time_repeats"] = [[w] for w in ch["wall_time"]]
    recs[4]["choices"][0]["wall_time_repeats"][0][0] *= 3  # another job slowed one turn
    tm, fit = fit_time_model(c, recs)
    assert fit["source"] == "timing" and fit["disturbed"] == 1
    assert tm.forward_scale == pytest.approx(1.2, rel=1e-6)
    assert tm.step_overhead == pytest.approx(0.02, rel=1e-6)
    # A regression by iteratively reweighted least squares: exact to about its weight
    # floor (1e-4 s of residual), not to rounding.
    assert tm.prefill_scale == pytest.approx(1.1, rel=1e-2)
    assert tm.turn_overhead == pytest.approx(0.05, abs=1e-3)


def test_row_overhead_is_fitted_on_one_drafting_method() -> None:
    """The per-draft-row term comes from one drafting method's walls (AR has no rows);
    one turn slowed 3x by another job does not move it (a weighted median)."""
    c = grid_curve()
    recs = _ar_records(cycle_model(3), _prompts(3, 12), 30)
    cfg = ReplayConfig(max_new_tokens=30, max_draft_nodes=16)
    sims = simulate(recs, make_policy("pld:mode=fixed", cfg, c).build(), cfg)
    truth = TimeModel(c, step_overhead=0.02, count_policy_time=False, row_overhead=0.004)
    answers = [{"question_id": r["question_id"], "choices": [
        {"wall_time": [truth.turn(t) for t in sims[str(r["question_id"])]]}]} for r in recs]
    answers[2]["choices"][0]["wall_time"][0] *= 3
    start = TimeModel(c, step_overhead=0.02, count_policy_time=False)
    tm, stats = fit_row_overhead(start, recs, [(sims, answers)])
    assert tm.row_overhead == pytest.approx(0.004, rel=1e-6)
    assert stats["row_fit_turns"] == sum(
        1 for t in sims.values() for x in t if any(s.drafted for s in x.steps))
    assert tm.turn(sims["0"][0]) == pytest.approx(truth.turn(sims["0"][0]))


# ---- policies ----------------------------------------------------------------------


def test_replay_steps_record_drafts_and_contexts() -> None:
    prompt = [5, 6, 7, 8, 5, 6, 7]
    out = [8, 5, 6, 9, 9]
    steps = replay_steps(FixedPolicy(create_drafter("pld")), 0, prompt, out, False, [EOS],
                         ReplayConfig(max_new_tokens=5, max_draft_nodes=16))
    assert sum(s.committed for s in steps) == len(out) - 1  # the prefill commits out[0]
    assert [s.context for s in steps] == [len(prompt) + sum(x.committed for x in steps[:i])
                                          for i in range(len(steps))]
    assert steps[0].drafted > 0 and steps[0].committed == 3  # 5 6 accepted, bonus 9


@pytest.mark.parametrize("drafter", ["pld", "portfolio", "sam"])
def test_adaptive_replay_equals_the_engine(drafter: str) -> None:
    """The replayed planner makes the engine's decisions: same accept lengths."""
    curve = CostCurve((1, 4, 8, 17), (1.0, 1.1, 1.6, 2.8), 0.0)  # seconds: overhead stays 0
    model = cycle_model(3)
    prompts = _prompts(3, 6)
    eng = Engine(model, FoldedByteTokenizer(V), EngineConfig(max_len=512, max_draft_nodes=16))
    eng.use_cost_curve(curve)
    cfg = ReplayConfig(max_new_tokens=40, max_draft_nodes=16, max_len=eng.max_len)
    planner = DraftPlanner(16, lambda: curve)
    policy = AdaptivePolicy(drafter, create_drafter(drafter), planner)
    params = SamplingParams(max_new_tokens=40)
    drafted = 0
    for i, p in enumerate(prompts):
        ar = eng.generate(p, params, drafter="none")
        spec = eng.generate(p, params, drafter=drafter, mode="adaptive")
        assert isinstance(ar, GenerationResult) and isinstance(spec, GenerationResult)
        assert spec.token_ids == ar.token_ids
        steps = replay_steps(policy, i, p, ar.token_ids, ar.finish_reason == "eos", [EOS], cfg)
        assert [s.committed for s in steps] == spec.accept_lengths
        drafted += sum(s.drafted for s in steps)
    assert drafted > 0


def test_sizing_follows_the_curve_and_the_oracle_bounds_it() -> None:
    recs = _ar_records(cycle_model(5), _prompts(5, 8), 40)
    cfg = ReplayConfig(max_new_tokens=40, max_draft_nodes=16)
    cheap = grid_curve(per_row=0.001, per_ctx=0.0)
    dear = grid_curve(per_row=1.0, per_ctx=0.0)  # a row costs a whole step
    drafted = {}
    for name, c in (("cheap", cheap), ("dear", dear)):
        sims = simulate(recs, make_policy("pld:mode=adaptive", cfg, c).build(), cfg)
        drafted[name] = predict(recs, sims, TimeModel(c))["overall"]["drafted"]
    assert drafted["dear"] < drafted["cheap"] / 4
    tm = TimeModel(cheap, count_policy_time=False)
    speed = {}
    for m in ("ar", "pld:mode=fixed", "pld:mode=adaptive", "oracle:drafters=pld"):
        sims = simulate(recs, make_policy(m, cfg, cheap).build(), cfg)
        speed[m] = predict(recs, sims, tm)["overall"]["tokens_per_s"]
    assert speed["oracle:drafters=pld"] >= max(speed["pld:mode=fixed"],
                                               speed["pld:mode=adaptive"])
    assert speed["pld:mode=fixed"] > speed["ar"]


def test_oracle_drafts_exactly_the_longest_accepted_path() -> None:
    oracle = OraclePolicy("o", [create_drafter("pld"), create_drafter("llma")],
                          lambda rows, ctx: 1.0)
    d = oracle.drafter
    d.start(0, [1, 2, 3, 1, 2])
    d.observe(0, [3], DraftTree.empty(), None)
    oracle.foresee([1, 2, 9], frozenset(), 16)
    tree = d.propose(0, 16)
    assert tree.tokens.tolist() == [1, 2] and tree.is_chain
    oracle.foresee([7], frozenset(), 16)
    assert len(d.propose(0, 16)) == 0


# ---- portfolio and candidate choice ------------------------------------------------------


def test_planner_drafts_the_candidate_worth_more() -> None:
    from recallspec.engine.request import Request

    class Two(Drafter):
        name, needs_logits, contexts, offers_candidates = "two", False, 2, True

        def start(self, rid: int, prompt: Any) -> None: ...

        def observe(self, *a: Any) -> None: ...

        def stop(self, rid: int) -> None: ...

        def context(self, rid: int) -> int:
            return 0

        def propose(self, rid: int, n: int) -> DraftTree:
            return DraftTree.chain([1, 2, 3, 4][:n])

        def candidates(self, rid: int, n: int) -> list[tuple[int, DraftTree]]:
            return [(0, DraftTree.chain([1, 2, 3, 4][:n])), (1, DraftTree.chain([5, 6][:n]))]

    curve = CostCurve((1, 8), (1.0, 1.2), 0.0)
    planner = DraftPlanner(8, lambda: curve)
    d = Two()
    req = Request(0, [1, 2], SamplingParams(max_new_tokens=50), d, None, sizing="adaptive")
    req.generated = [3]
    prior = planner.prior(d)
    for _ in range(30):  # context 1 drafts are always accepted, context 0 never
        prior.update(np.array([-1, 0]), [0, 1], key=1 * 3 + 1)
        prior.update(np.array([-1, 0]), [], key=0 * 3 + 1)
    trees, failed = planner.plan([req], [8])
    assert not failed and trees[0].tokens.tolist() == [5, 6]
    planner.observe(req, trees[0], [0, 1])
    assert req.draft.stats is not None and req.draft.stats.context == 1


def test_portfolio_candidates_and_lossless_adaptive() -> None:
    d = create_drafter("portfolio")
    d.start(0, [4, 5, 6, 7, 4, 5, 9, 4, 5])
    cands = d.candidates(0, 8)  # type: ignore[attr-defined]
    assert len({c for c, _ in cands}) == len(cands) >= 2  # one context per kind
    assert cands[0][1].tokens.tolist()[:1] == [6]  # the automaton: the earliest "4 5"
    assert cands[1][1].tokens.tolist()[:1] == [9]  # the latest occurrence
    assert d.propose(0, 8).tokens.tolist() == cands[0][1].tokens.tolist()
    eng = Engine(cycle_model(7), FoldedByteTokenizer(V), EngineConfig(max_len=512))
    eng.use_cost_curve(CostCurve((1, 16), (1.0, 1.5), 0.0))
    params = SamplingParams(max_new_tokens=40)
    for p in _prompts(7, 4):
        ar = eng.generate(p, params, drafter="none")
        sp = eng.generate(p, params, drafter="portfolio", mode="adaptive")
        assert isinstance(ar, GenerationResult) and isinstance(sp, GenerationResult)
        assert sp.token_ids == ar.token_ids


# ---- the CLI ---------------------------------------------------------------------------


def test_an_unlabeled_method_is_sized_as_its_answers_were_recorded() -> None:
    """``pld`` without :mode= replays cost-aware for answers recorded since that is the
    default (run.json's sizing_default), fixed for answers recorded before (no key); a
    stated sizing is replayed as stated."""
    from recallspec.bench.common.method import recorded_sizing_default
    from recallspec.errors import DataError
    from recallspec.params import Sizing

    assert recorded_sizing_default({}) == "adaptive"  # no run.json: today's default
    assert recorded_sizing_default({"max_new_tokens": 8}) == "fixed"  # before the key
    assert recorded_sizing_default({"sizing_default": "adaptive"}) == "adaptive"
    assert recorded_sizing_default({"sizing_default": "fixed"}) == "fixed"
    with pytest.raises(DataError, match="sizing_default"):
        recorded_sizing_default({"sizing_default": "ems"})
    curve = grid_curve()
    cases: tuple[tuple[Sizing, type], ...] = (("adaptive", AdaptivePolicy),
                                              ("fixed", FixedPolicy))
    for default, policy in cases:
        cfg = ReplayConfig(max_new_tokens=8, sizing_default=default)
        assert isinstance(make_policy("pld", cfg, curve).build(), policy)
        assert isinstance(make_policy("pld:mode=fixed", cfg, curve).build(), FixedPolicy)
        assert isinstance(make_policy("pld:mode=adaptive", cfg, curve).build(), AdaptivePolicy)
        assert isinstance(make_policy("ar", cfg, curve).build(), FixedPolicy)


def test_cli_predicts_and_compares_with_recorded_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from recallspec.bench.common.answers import answers_path
    from recallspec.bench.suite.runner import BenchConfig, run_bench

    # pld at fixed sizes, recorded and predicted alike (the label says so: a drafter named
    # without a sizing is cost-aware, in the engine and in the prediction).
    pld = "pld:mode=fixed"
    eng = Engine(cycle_model(5), FoldedByteTokenizer(V), EngineConfig(max_len=512))
    run_bench(BenchConfig(suite="demo", methods=("ar", pld), max_new_tokens=30), tmp_path,
              engine=eng, progress=False, log=lambda m: None)
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps(grid_curve().to_json()))
    out = tmp_path / "pred.json"
    assert main(["bench", "replay", "--answers", str(answers_path(tmp_path, "ar")),
                 "--methods", f"ar,{pld},portfolio:mode=adaptive,oracle", "--predict-time",
                 "--curve", str(curve), "--out", str(out), "--no-policy-time"]) == 0
    text = capsys.readouterr().out
    assert "| overall |" in text and "real" in text
    res = json.loads(out.read_text())
    assert set(res["predicted"]) == {"ar", pld, "portfolio:mode=adaptive", "oracle"}
    assert set(res["recorded"]) == {"ar", pld}  # methods the run recorded
    assert res["predicted"][pld]["overall"]["mat"] > 1.0
    assert res["fit"]["row_fit"] == "auto"  # pld: the only recorded drafting method
    assert set(res["fit"]["row_overhead_ms"]) == {pld, "portfolio:mode=adaptive", "oracle"}
    # llma was not recorded: no row term can be fitted on it, said clearly
    assert main(["bench", "replay", "--answers", str(answers_path(tmp_path, "ar")),
                 "--methods", f"ar,{pld},llma", "--predict-time", "--curve", str(curve),
                 "--fit-rows-on", "llma"]) != 0
    assert "--fit-rows-on llma" in capsys.readouterr().err


@needs_model
def test_portfolio_lossless_and_replayed_exactly_on_the_real_model(
    spec_bench_prompts: list[str],
) -> None:
    """Real model: the cost-aware portfolio's output is token-identical to AR, and replay
    reproduces its steps (a seconds-scale synthetic curve keeps the engine's learned step
    overhead at 0, so its choices depend on the curve alone)."""
    curve = CostCurve((1, 4, 8, 17), (1.0, 1.1, 1.6, 2.8), 0.0)
    eng = Engine.load(max_draft_nodes=16)
    eng.use_cost_curve(curve)
    cfg = ReplayConfig(max_new_tokens=48, max_draft_nodes=16, max_len=eng.max_len)
    policy = AdaptivePolicy("portfolio", create_drafter("portfolio"),
                            DraftPlanner(16, lambda: curve))
    params = SamplingParams(max_new_tokens=48)
    eos = sorted(eng.tokenizer.eos_token_ids)
    accepted = 0
    for i, text in enumerate(spec_bench_prompts[::4]):
        ids = eng.encode_prompt(text, chat=True)
        ar = eng.generate(ids, params, drafter="none")
        sp = eng.generate(ids, params, drafter="portfolio", mode="adaptive")
        assert isinstance(ar, GenerationResult) and isinstance(sp, GenerationResult)
        assert sp.token_ids == ar.token_ids
        steps = replay_steps(policy, i, ids, ar.token_ids, ar.finish_reason == "eos", eos, cfg)
        assert [s.committed for s in steps] == sp.accept_lengths
        accepted += sum(sp.accept_lengths) - sp.steps
    assert accepted > 0
