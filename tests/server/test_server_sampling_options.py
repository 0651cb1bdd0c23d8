"""`n`, logprobs, penalties and seeds through a real `recallspec serve` (the default
drafting policy) and the official ``openai`` client: logprobs of speculative decoding
equal autoregressive decoding's, streamed and not, in both APIs' shapes; penalised
greedy token-identical across drafters and to the offline engine; ``n`` choices with
derived seeds; a seed's answer the same alone and among concurrent requests; a 400
naming the field for what stays unsupported or out of range."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.server import MODEL, Server, ext, start_server, total

from recallspec.decoding.sampling import SamplingParams

pytestmark = [pytest.mark.server, pytest.mark.slow]

QUESTION = "List the days of the week, then list them again: Monday, Tuesday,"
TEXT = "The days of the week are Monday, Tuesday, Wednesday,"
CODE = "Write a Python function that adds two numbers, and a second one that adds three."
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # No --drafter, no --mode: the default policy (cost-aware sizing) drafts.
    yield from start_server(tmp_path_factory.mktemp("serve") / "server.log",
                            "--max-batch-size", "8")


def _chat_lps(content: list[Any]) -> list[tuple[Any, ...]]:
    return [(c.token, c.logprob, c.bytes, [(t.token, t.logprob) for t in c.top_logprobs])
            for c in content]


def test_chat_logprobs_speculative_equal_autoregressive(server: Server) -> None:
    client = server.client()
    kw: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
                          "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": True,
                          "top_logprobs": 3}
    got: dict[str, list[tuple[Any, ...]]] = {}
    for drafter in (None, "none", "pld"):
        extra = ext() if drafter is None else ext(drafter=drafter)
        r = client.chat.completions.create(**kw, extra_body=extra)
        c = r.choices[0]
        assert c.logprobs is not None and c.logprobs.content is not None
        ids = (c.model_extra or {})["token_ids"]
        assert r.usage is not None and len(c.logprobs.content) == len(ids) == (
            r.usage.completion_tokens)
        got[str(drafter)] = _chat_lps(c.logprobs.content)
        for token, lp, _, top in got[str(drafter)]:
            assert len(top) == 3 and top[0] == (token, lp)  # greedy: the most likely
            assert lp == max(v for _, v in top) and lp <= 0.0
        assert "".join(e[0] for e in got[str(drafter)]) == c.message.content
        chunks = list(client.chat.completions.create(**kw, stream=True, extra_body=extra))
        streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs
                    for e in ch.choices[0].logprobs.content or []]
        assert _chat_lps(streamed) == got[str(drafter)]
    assert got["None"] == got["none"] == got["pld"]  # the same bits: no tolerance


def test_completion_logprobs_speculative_equal_autoregressive(server: Server) -> None:
    client = server.client()
    kw: dict[str, Any] = {"model": MODEL, "prompt": TEXT, "max_tokens": MAX_TOKENS,
                          "temperature": 0, "logprobs": 2}
    got = {}
    for drafter in (None, "none", "llma"):
        extra = {} if drafter is None else ext(drafter=drafter)
        r = client.completions.create(**kw, extra_body=extra)
        lp = r.choices[0].logprobs
        assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
        assert lp.text_offset is not None and "".join(lp.tokens) == r.choices[0].text
        assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]
        for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs,
                                     strict=True):
            assert len(top) == 2 and max(top.values()) == value == top[token]
        got[str(drafter)] = (lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset)
        chunks = list(client.completions.create(**kw, stream=True, extra_body=extra))
        pieces = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
        assert [t for p in pieces for t in p.tokens or []] == lp.tokens
        assert [v for p in pieces for v in p.token_logprobs or []] == lp.token_logprobs
        assert [o for p in pieces for o in p.text_offset or []] == lp.text_offset
    assert got["None"] == got["none"] == got["llma"]
    r = client.completions.create(**kw | {"logprobs": 0})
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.top_logprobs == [
        None] * MAX_TOKENS


@pytest.mark.parametrize("penalty", [{"presence_penalty": 1.2}, {"frequency_penalty": 0.9},
                                     {"repeat_penalty": 1.1}])
def test_penalised_greedy_identical_across_drafters(server: Server, engine: Any,
                                                    penalty: dict[str, float]) -> None:
    client = server.client()
    ids = engine.encode_prompt(CODE, chat=True)
    want = engine.generate(ids, SamplingParams(max_new_tokens=MAX_TOKENS, ignore_eos=True,
                                               **penalty), drafter="none")
    plain = engine.generate(ids, SamplingParams(max_new_tokens=MAX_TOKENS, ignore_eos=True),
                            drafter="none")
    assert want.token_ids != plain.token_ids  # the penalty matters here
    # OpenAI's penalties are the client's arguments, llama.cpp's an extra field.
    openai_kw = {k: v for k, v in penalty.items() if k != "repeat_penalty"}
    extra = {k: v for k, v in penalty.items() if k == "repeat_penalty"} | {"ignore_eos": True}
    for drafter in (None, "none", "pld", "sam"):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": CODE}], max_tokens=MAX_TOKENS,
            temperature=0, **openai_kw,
            extra_body=(ext() if drafter is None else ext(drafter=drafter)) | extra)
        assert (r.choices[0].model_extra or {})["token_ids"] == want.token_ids, drafter


def _ids(choice: Any) -> list[int]:
    return list((choice.model_extra or {})["token_ids"])


def test_n_choices_with_derived_seeds(server: Server) -> None:
    client = server.client()
    kw: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
                          "max_tokens": 12, "temperature": 1.0, "extra_body": ext()}
    r = client.chat.completions.create(**kw, n=3, seed=42)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage is not None and r.usage.completion_tokens == sum(
        len(_ids(c)) for c in r.choices)
    for i, c in enumerate(r.choices):  # choice i is the single request with seed 42 + i
        one = client.chat.completions.create(**kw, seed=42 + i)
        assert _ids(one.choices[0]) == _ids(c) and one.choices[0].message.content == (
            c.message.content)
    assert len({tuple(_ids(c)) for c in r.choices}) > 1
    # Streamed: the choices' chunks interleave, each with its index.
    chunks = list(client.chat.completions.create(**kw, n=3, seed=42, stream=True,
                                                 stream_options={"include_usage": True}))
    text = ["", "", ""]
    for ch in chunks:
        for c in ch.choices:
            text[c.index] += c.delta.content or ""
    assert text == [c.message.content for c in r.choices]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == (
        r.usage.completion_tokens)
    # The legacy API, greedy: identical choices.
    rc = client.completions.create(model=MODEL, prompt=TEXT, max_tokens=8, temperature=0, n=2,
                                   logprobs=1)
    assert [c.index for c in rc.choices] == [0, 1] and rc.choices[0].text == rc.choices[1].text
    assert rc.choices[0].logprobs == rc.choices[1].logprobs
    server.wait_idle()


def test_a_seed_gives_the_same_answer_alone_and_among_others(server: Server) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": MAX_TOKENS, "temperature": 0.9, "seed": 7, **ext()}
    others = [{"model": MODEL, "prompt": f"Story number {i}: once upon a time",
               "max_tokens": 4 + 3 * i, "temperature": 1.0} for i in range(5)]

    async def run(with_others: bool) -> list[int]:
        async with httpx.AsyncClient(base_url=f"{server.base}/v1", timeout=300) as c:
            calls = [c.post("/chat/completions", json=body)]
            if with_others:
                calls += [c.post("/completions", json=o) for o in others]
            rs = await asyncio.gather(*calls)
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
        return list(rs[0].json()["choices"][0]["token_ids"])

    alone = asyncio.run(run(False))
    assert asyncio.run(run(True)) == alone
    assert asyncio.run(run(True)) == alone
    server.wait_idle()


BAD = [  # (path, fields over a valid body, the field the error names)
    ("completions", {"logit_bias": {"50": 10}}, "logit_bias"),
    ("completions", {"best_of": 2}, "best_of"),
    ("completions", {"echo": True}, "echo"),
    ("completions", {"suffix": "x"}, "suffix"),
    ("completions", {"n": 0}, "n"),
    ("completions", {"n": 17}, "n"),
    ("completions", {"logprobs": 6}, "logprobs"),
    ("completions", {"logprobs": True}, "logprobs"),
    ("completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("completions", {"frequency_penalty": -2.01}, "frequency_penalty"),
    ("completions", {"repeat_penalty": 0}, "repeat_penalty"),
    ("completions", {"repeat_last_n": -2}, "repeat_last_n"),
    ("completions", {"top_logprobs": 2}, "top_logprobs"),  # chat only
    ("chat/completions", {"logprobs": 1}, "logprobs"),
    ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs
    ("chat/completions", {"logit_bias": {"50": 10}}, "logit_bias"),
    ("chat/completions", {"response_format": {"type": "json"}}, "response_format"),
    ("chat/completions", {"tools": [{"type": "function"}]}, "tools"),
]


def test_unsupported_and_out_of_range_fields_are_400_naming_them(server: Server) -> None:
    with httpx.Client(base_url=f"{server.base}/v1", timeout=60) as c:
        for path, fields, name in BAD:
            base: dict[str, Any] = {"model": MODEL, "max_tokens": 2}
            if path == "completions":
                base["prompt"] = "x"
            else:
                base["messages"] = [{"role": "user", "content": "x"}]
            r = c.post(f"/{path}", content=json.dumps(base | fields))
            assert r.status_code == 400, (path, fields, r.text)
            assert name in r.json()["error"]["message"], (path, fields, r.text)
    server.wait_idle()


def test_n_choices_prefill_their_prompt_once(server: Server) -> None:
    """``n`` choices of a long prompt: one prefills it, the others copy its rows (the
    prefix cache's hits grow by nearly (n - 1) prompts); greedy, all four answer alike."""
    server.wait_idle()
    before = server.metrics()
    days = " ".join(["Monday Tuesday Wednesday Thursday Friday Saturday Sunday"] * 12)
    r = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Count these words: {days}"}],
        max_tokens=6, temperature=0, n=4, extra_body=ext())
    assert r.usage is not None and r.usage.prompt_tokens > 100
    assert len({c.message.content for c in r.choices}) == 1
    after = server.wait_idle()
    hits = (total(after, "recallspec:prefix_cache_hits_total")
            - total(before, "recallspec:prefix_cache_hits_total"))
    # Each of the three others reuses all but the last <= SHARE_WAIT_TOKENS (64) tokens.
    assert hits >= 3 * (r.usage.prompt_tokens - 64)
