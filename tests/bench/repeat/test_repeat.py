"""`recallspec bench repeat` without servers: the workloads it builds, the checks on its
settings, and its figures (tokens/s, speedup, identical greedy answers) from records."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from helpers.availability import data_dir_or_unavailable

from recallspec.bench.repeat.command import Record
from recallspec.bench.repeat.report import comparisons, render_markdown, summaries, write_plot
from recallspec.bench.repeat.workloads import FOLLOW_UPS, RepeatConfig, load_workloads
from recallspec.errors import DataError


def _data_or_skip() -> None:
    data_dir_or_unavailable()


def test_workloads() -> None:
    _data_or_skip()
    cfg = RepeatConfig(questions=3, samples=4, tasks=3, follow_ups=2, prompts=7)
    convs = load_workloads(cfg)
    sc = [c for c in convs if c.workload == "self_consistency"]
    code = [c for c in convs if c.workload == "code_edit"]
    spec = [c for c in convs if c.workload == "spec_bench"]
    assert len(sc) == 3 and all(c.samples == 4 and len(c.turns) == 1 for c in sc)
    assert len({c.tenant for c in sc}) == 3  # a tenant per question
    assert [c.id.split("-")[0] for c in code] == ["humaneval", "humaneval", "mbpp"]
    assert all(c.turns[1:] == FOLLOW_UPS[:2] for c in code)
    assert len(spec) == 7 and len({c.id for c in spec}) == 7
    assert len({c.tenant for c in spec}) == 1
    shared = load_workloads(dataclasses.replace(cfg, workloads=("self_consistency",),
                                                tenancy="shared"))
    assert len({c.tenant for c in shared}) == 1
    assert all(c.history for c in code)


def test_reask_and_code_edit_without_history() -> None:
    _data_or_skip()
    cfg = RepeatConfig(tasks=2, follow_ups=2, prompts=7, reask_prompts=5, reask_times=3,
                       code_edit_history=False)
    convs = load_workloads(cfg)
    spec = {c.id.split("-", 1)[1] for c in convs if c.workload == "spec_bench"}
    reask = [c for c in convs if c.workload == "reask"]
    assert len(reask) == 5 and all(c.samples == 3 and len(c.turns) == 1 for c in reask)
    assert len({c.tenant for c in reask}) == 1  # one user re-asking
    assert not spec & {c.id.split("-", 1)[1] for c in reask}  # not the control's prompts
    assert cfg.temperature_for("reask") == 0.0 and cfg.temperature_for("code_edit") == 0.0
    assert cfg.temperature_for("self_consistency") == cfg.temperature
    for c in (c for c in convs if c.workload == "code_edit"):
        assert not c.history and len(c.turns) == 3
        assert [t.split("\n\n")[-1] for t in c.turns[1:]] == list(FOLLOW_UPS[:2])
        assert all(t.startswith(c.turns[0]) for t in c.turns[1:])  # the task restated


@pytest.mark.parametrize("kw", [
    {"workloads": ("nope",)}, {"workloads": ()}, {"drafters": ()}, {"memory_tokens": 0},
    {"samples": 0}, {"follow_ups": 4}, {"tenancy": "user"}, {"temperature": 0.0},
    {"max_tokens": 0}, {"threads": 0}, {"reask_times": 1}, {"reask_prompts": 0},
    {"reask_temperature": -0.1},
])
def test_bad_settings(kw: dict[str, Any]) -> None:
    with pytest.raises(DataError):
        RepeatConfig(**kw)


def _rec(memory: bool, workload: str, conv: str, turn: int, tokens: int, seconds: float,
         ids: list[int], sample: int = 0, temperature: float | None = None) -> dict[str, Any]:
    server = f"sam/{'memory' if memory else 'no-memory'}"
    r = Record(server, "sam", memory, workload, conv, turn, sample, ok=True, seconds=seconds,
               output_tokens=tokens, mean_acceptance_length=2.0 if memory else 1.0,
               steps=tokens // 2 if memory else tokens, token_ids=ids,
               temperature=temperature)
    return dataclasses.asdict(r)


def test_figures(tmp_path: Path) -> None:
    recs = [
        _rec(False, "code_edit", "t1", 0, 100, 2.0, [1, 2]),
        _rec(True, "code_edit", "t1", 0, 100, 2.0, [1, 2]),
        _rec(False, "code_edit", "t1", 1, 100, 2.0, [3]),
        _rec(True, "code_edit", "t1", 1, 100, 1.0, [4]),  # differs: counted
        _rec(False, "self_consistency", "q", 0, 50, 1.0, [5], sample=0),
        _rec(True, "self_consistency", "q", 0, 60, 1.0, [6], sample=0),
    ]
    recs.append({**_rec(True, "code_edit", "t2", 0, 0, 0.5, []), "ok": False, "error": "boom"})
    s = {(x["server"], x["workload"]): x for x in summaries(recs)}
    on = s[("sam/memory", "code_edit")]
    assert on["requests"] == 3 and on["errors"] == 1 and on["tok_per_s"] == pytest.approx(200 / 3)
    assert on["first_turn"]["tok_per_s"] == pytest.approx(50.0)
    assert on["accepted_per_step"] == pytest.approx(2.0)
    c = {x["workload"]: x for x in comparisons(recs)}
    assert c["code_edit"]["speedup"] == pytest.approx((200 / 3) / 50)
    assert c["code_edit"]["follow_up_speedup"] == pytest.approx(2.0)
    assert (c["code_edit"]["identical"], c["code_edit"]["compared"]) == (1, 2)
    assert c["self_consistency"]["identical"] is None  # sampled: not compared
    assert c["self_consistency"]["speedup"] == pytest.approx(1.2)
    rep = {"config": {**dataclasses.asdict(RepeatConfig()), "threads": 2,
                      "max_tokens_per_workload": {"code_edit": 192}},
           "machine": {"cpu": "x", "cpus": 2, "loadavg_1m": 0.1},
           "servers": {"sam/memory": {"memory_tokens": 5, "memory_gauges": {
               "recallspec:memory_tokens": 300.0}}},
           "summaries": summaries(recs), "comparisons": comparisons(recs)}
    md = render_markdown(rep)
    assert "| code_edit | sam | 50.0 | 66.7 | 1.33x | >= 1.5x |" in md and "1/2" in md
    assert "boom" in md and "300 tokens" in md
    pytest.importorskip("matplotlib")
    assert write_plot(rep, tmp_path / "r.png") and (tmp_path / "r.png").stat().st_size > 0


def test_reask_figures() -> None:
    """Re-sends compared alone; greedy reask answers checked for identity (their records
    say T = 0), sampled ones not; the description says where the repetition is."""
    recs = []
    for memory, secs in ((False, 2.0), (True, 0.5)):
        recs += [_rec(memory, "reask", "r1", 0, 100, 2.0, [1], sample=0, temperature=0.0),
                 _rec(memory, "reask", "r1", 0, 100, secs, [1], sample=1, temperature=0.0)]
    c = comparisons(recs)[0]
    assert c["resend_speedup"] == pytest.approx(4.0)
    assert c["speedup"] == pytest.approx((200 / 2.5) / 50)
    assert (c["identical"], c["compared"], c["target"]) == (2, 2, None)
    s = {x["server"]: x for x in summaries(recs)}
    assert s["sam/memory"]["resends"]["tok_per_s"] == pytest.approx(200.0)
    sampled = [{**r, "temperature": 0.7} for r in recs]
    assert comparisons(sampled)[0]["identical"] is None
    cfg = {**dataclasses.asdict(RepeatConfig(workloads=("reask", "code_edit"),
                                             code_edit_history=False)),
           "threads": 2, "max_tokens_per_workload": {"reask": 128}, "memory_prompt_tail": 32}
    md = render_markdown({"config": cfg, "machine": {}, "servers": {}, "summaries": summaries(
        recs), "comparisons": comparisons(recs)})
    assert "reask re-sends alone" in md and "sam 4.00x" in md
    assert "prompt's last 32 tokens" in md and "only in the memory" in md
    assert "self_consistency:" not in md  # only the workloads run are described
