"""`recallspec bench serve` workloads: the sessions each builds from the shared data
(deterministic, the right shapes, transcripts that grow, documents shared by the rag
sessions), the context they need, the targets with the prefix cache off, and the report's
aggregation over turns >= 2."""

from __future__ import annotations

import re

import pytest
from helpers.availability import data_dir_or_unavailable

from recallspec.bench.serve.client import RequestRecord
from recallspec.bench.serve.config import PREFIX_TARGETS
from recallspec.bench.serve.report import prefix_rows, render_markdown, summaries, summarize
from recallspec.bench.serve.targets import command, make_target
from recallspec.bench.serve.workloads import (
    AGENT_SYSTEM,
    FOLLOW_UPS,
    RAG_SYSTEM,
    Session,
    Workload,
    context_needed,
    default_context,
    load_sessions,
    messages,
    rag_questions,
    tool_results,
)
from recallspec.errors import DataError


def _load(name: str, **kw: int) -> list[Session]:
    data_dir_or_unavailable()
    return load_sessions(Workload(name, **kw), seed=0)


def test_sessions_are_deterministic_and_seeded() -> None:
    for name in ("multiturn", "agent", "rag"):
        a = _load(name, sessions=6)
        assert a == _load(name, sessions=6)  # same data, same seed: the same sessions
        b = load_sessions(Workload(name, sessions=6), seed=1)
        assert sorted(s.id for s in a) == sorted(s.id for s in b)  # the seed orders them
        assert len({s.id for s in a}) == 6
    assert [s.id for s in _load("spec_bench")] != sorted(s.id for s in _load("spec_bench"))


def test_multiturn_mixes_mt_bench_and_sharegpt_chats() -> None:
    ss = _load("multiturn", sessions=5, turns=3)
    by = {src: [s for s in ss if s.source == src] for src in ("mt_bench", "sharegpt")}
    assert (len(by["mt_bench"]), len(by["sharegpt"])) == (3, 2)  # half each, first rounded up
    assert all(len(s.turns) == 2 and s.history and s.system is None for s in by["mt_bench"])
    for s in by["sharegpt"]:  # its first human turn, then the fixed follow-ups
        assert s.turns[1:] == FOLLOW_UPS[:2] and len(s.turns[0]) <= 2000
    assert all(len(s.turns) == 1 for s in _load("multiturn", sessions=4, turns=1))


def test_a_transcript_grows_with_the_servers_own_answers() -> None:
    s = _load("multiturn", sessions=1)[0]  # an MT-Bench chat: two turns
    first = messages(s, 0, [])
    assert first == [{"role": "user", "content": s.turns[0]}]
    second = messages(s, 1, ["my answer"])
    assert second == [*first, {"role": "assistant", "content": "my answer"},
                      {"role": "user", "content": s.turns[1]}]
    with pytest.raises(ValueError):
        messages(s, 1, [])  # the answer to turn 0 is needed
    with pytest.raises(ValueError):
        messages(s, 2, ["a", "b"])  # no such turn


def test_agent_steps_add_tool_results_to_the_whole_transcript() -> None:
    ss = _load("agent", sessions=4)
    assert {s.source for s in ss} == {"humaneval", "mbpp"}
    for s in ss:
        assert len(s.turns) == 4 and s.system == AGENT_SYSTEM and s.history
        assert s.turns[1].startswith("Tool result") and "1 failed" in s.turns[1]
        assert "failed" not in s.turns[3] and " passed in " in s.turns[3]
        answers = [f"answer {k}" for k in range(3)]
        sizes = [len(messages(s, k, answers)) for k in range(4)]
        assert sizes == [2, 4, 6, 8]  # system, then one more (answer, tool result) each step
        last = messages(s, 3, answers)
        assert [m["content"] for m in last if m["role"] == "assistant"] == answers
    fail_first, fail_last, ok = tool_results("f", ["assert f(1) == 2", "assert f(2) == 3"])
    assert "F.\n" in fail_first and "assert f(1) == 2" in fail_first
    assert ".F\n" in fail_last and "test_2" in fail_last and "assert f(2) == 3" in fail_last
    assert ok.endswith("..\n2 passed in 0.02s")
    for s in ss:  # the test file is named after the task's function
        fn = re.search(r"pytest -q test_(\w+)\.py", s.turns[1])
        assert fn and f"{fn.group(1)}(" in s.turns[0], s.id


def test_rag_sessions_share_a_document_prefix_and_ask_different_questions() -> None:
    ss = _load("rag", sessions=8, documents=2, turns=3)
    docs = {s.prefix for s in ss}
    assert len(docs) == 2 and all(p.startswith("Document:\n") and len(p) > 1000 for p in docs)
    for doc in docs:
        readers = [s for s in ss if s.prefix == doc]
        assert len(readers) == 4
        asked = [q for s in readers for q in s.turns]
        assert len(set(asked)) == len(asked) == 12  # every request a different question
        for s in readers:
            assert not s.history and s.system == RAG_SYSTEM and len(s.turns) == 3
            for k in range(3):  # no transcript: the same prefix, the question at the end
                m = messages(s, k, [])
                assert [x["role"] for x in m] == ["system", "user"]
                assert m[1]["content"] == doc + s.turns[k]
    qs = rag_questions("Yesterday the mayor of Springfield met Anna Smith, said Bob.")
    assert qs[-1] == "What does the document say about Anna Smith?"
    assert not any("Yesterday" in q or "Bob" in q for q in qs)  # sentence start; short


def test_context_covers_the_longest_session() -> None:
    chat = Session("c", "x", ("a" * 250, "b" * 25), system="s" * 25)
    # system 10 + 8; turns 100 + 8 and 10 + 8; one earlier answer 64 + 8; the answer 64;
    # the template's 32: 312 -> rounded up to 512.
    assert context_needed([chat], 64) == 512
    rag = Session("r", "x", ("q" * 25, "q" * 50), history=False, prefix="d" * 2500)
    assert context_needed([rag], 64) == 256 * 5  # 1000 + 20 + 8 + 64 + 32 = 1124
    assert context_needed([chat, rag], 64) == 256 * 5
    assert default_context(Workload("spec_bench"), [rag] * 3, 4096) == 2048  # as before
    assert default_context(Workload("rag"), [rag], 64) == 2048  # at least 2048
    assert default_context(Workload("rag"), [rag], 2000) == 256 * 12  # 1028 + 2032


def test_workloads_and_nocache_targets_are_checked() -> None:
    from recallspec.bench.serve.config import ServeBenchConfig

    with pytest.raises(DataError):
        Workload("chat")
    with pytest.raises(DataError):
        Workload("agent", turns=5)  # the task and three tool results
    with pytest.raises(DataError):
        Workload("rag", sessions=0)
    assert ServeBenchConfig(workload=Workload("rag")).targets == PREFIX_TARGETS
    assert "vllm" in ServeBenchConfig().targets  # spec_bench's default, unchanged
    cfg = ServeBenchConfig(workload=Workload("multiturn"), targets=("ours-off-nocache",),
                           context=1024)
    on, off = make_target("ours-adaptive", cfg), make_target("ours-adaptive-nocache", cfg)
    assert (on.mode, on.drafter) == (off.mode, off.drafter) and "cache off" in off.description
    argv_on, argv_off = command(on, cfg, 8000)[0], command(off, cfg, 8000)[0]
    assert "--no-prefix-cache" not in argv_on and argv_off == [*argv_on, "--no-prefix-cache"]
    assert argv_off[argv_off.index("--max-len") + 1] == "1024"
    with pytest.raises(DataError, match="server flag"):  # a --url server has its own flags
        off.request_fields(launched=False)
    assert off.request_fields(launched=True) == {"recallspec": {"return_token_ids": True}}
    with pytest.raises(DataError):
        _ = ServeBenchConfig().context_len  # resolved from the workload at run time


def _rec(target: str, index: int, turn: int, ttft: float, *, prompt: int = 100,
         cached: int | None = 0, ok: bool = True) -> RequestRecord:
    return RequestRecord(target, 1.0, index, f"s{index}", "mt_bench", scheduled_s=0.0,
                         workload="multiturn", turn=turn, sent_s=float(turn),
                         end_s=turn + 0.5, ok=ok, error=None if ok else "boom",
                         ttft_s=ttft if ok else None, e2e_s=0.5 if ok else None,
                         output_tokens=8 if ok else 0, prompt_tokens=prompt if ok else None,
                         cached_tokens=cached if ok else None)


def test_report_aggregates_turns_two_and_later_apart() -> None:
    recs = [
        _rec("ours-off", 0, 0, 0.40, cached=20), _rec("ours-off", 0, 1, 0.10, cached=90),
        _rec("ours-off", 0, 2, 0.20, prompt=200, cached=150),
        _rec("ours-off", 1, 0, 0.50, cached=0), _rec("ours-off", 1, 1, 0.30, cached=None),
        _rec("ours-off", 1, 2, 0.0, ok=False),  # failed: counted, not in the latencies
    ]
    s = summarize(recs)
    assert (s["sessions"], s["requests"], s["later_turns"], s["errors"]) == (2, 6, 4, 1)
    assert s["ttft_s"]["p50"] == pytest.approx(0.30)  # all five successful turns
    assert s["ttft_later_s"]["p50"] == pytest.approx(0.20)  # 0.10, 0.20, 0.30
    assert s["ttft_later_s"]["p99"] == pytest.approx(0.298)
    # Cached share over the later turns that reported it: (90 + 150) / (100 + 200).
    assert s["cached_share_later"] == pytest.approx(0.8)
    assert s["cached_share"] == pytest.approx((20 + 90 + 150) / 500)
    assert s["max_prompt_tokens"] == 200
    single = summarize([_rec("t", 0, 0, 0.1)])
    assert single["later_turns"] == 0 and single["ttft_later_s"]["p50"] is None

    off = [_rec("ours-off-nocache", 0, k, t) for k, t in ((0, 0.4), (1, 0.5), (2, 0.7))]
    peer = [_rec("llamacpp", 0, k, t) for k, t in ((0, 0.9), (1, 1.0), (2, 1.2))]
    sums = summaries([*recs, *off, *peer])
    assert [x["workload"] for x in sums] == ["multiturn"] * 3
    (row,) = prefix_rows(sums)
    assert (row["target"], row["on"], row["off"]) == ("ours-off", pytest.approx(0.2),
                                                      pytest.approx(0.6))
    assert row["llamacpp"] == {"llamacpp": pytest.approx(1.1)}
    rep = {"config": {"sessions": 2, "requests": 6, "seed": 0, "max_tokens": 8,
                      "model": None, "threads": 2, "context": 2048},
           "workload": {"name": "multiturn", "description": "chats", "history": True},
           "machine": {}, "targets": {t: {"description": t} for t in
                                      ("ours-off", "ours-off-nocache", "llamacpp")},
           "summaries": sums}
    md = render_markdown(rep)
    assert "## 1 sessions/s" in md and "TTFT 2+ p50" in md and "its own earlier answers" in md
    assert "## Prefix cache: TTFT p50 over turns >= 2, `multiturn` (ms)" in md
    assert "| 1 sessions/s | ours-off | 200 | 600 | 0.33x | 1100 | 0.18x |" in md
