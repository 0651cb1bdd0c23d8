"""Live corpora and the response memory through a real `recallspec serve` process: add,
list, show and remove corpora (documents in the body, text and index files from
``--corpus-dir``), bad corpus requests refused with a clear 4xx, corpora added and
removed while 16 streams decode (in a server of this process whose corpus loads the test
holds: every stream ends while they wait), greedy output unchanged by a corpus that is
used, tenants' memories kept apart, the API key on the corpus routes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from helpers.availability import IN_CI
from helpers.real_model import TEST_DTYPE
from helpers.server import MODEL, Samples, Server, ext, start_server, total
from tokenizers import Tokenizer as HFTokenizer

from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import Engine, EngineConfig
from recallspec.models.tokenizer import Tokenizer
from recallspec.recall.live_corpora import read_documents
from recallspec.server import EngineLoop, Metrics, create_app

pytestmark = [pytest.mark.server, pytest.mark.slow]

MEMORY_TOKENS = 50_000
PASSAGE = ("The lighthouse keeper of Skerry Point logged every ship that passed: the Maren "
           "Lys on Tuesdays with timber, the Aurora Bay on Fridays with salt cod, and once "
           "a year the old mail steamer Halvard, which always sounded its horn three times.")
QUESTION = "Write a short story about a lighthouse keeper and the ships he watches."
# The longest wait for a state that must come: a hang guard only (a test fails on what
# it then reads, never on the time it took).
GUARD_S = 120.0
T = TypeVar("T")


def settled(read: Callable[[], T], ok: Callable[[T], bool], guard_s: float = GUARD_S) -> T:
    """``read()`` once ``ok`` holds of it, or its last value when ``guard_s`` passes
    first; the caller asserts on the value."""
    end = time.monotonic() + guard_s
    while not ok(value := read()) and time.monotonic() < end:
        time.sleep(0.1)
    return value


def _docs(n: int) -> list[str]:
    """``n`` documents of real text (Spec-Bench turns) or, without the data, made-up ones."""
    from recallspec.data.paths import DataNotFoundError, data_dir

    try:
        lines = (data_dir() / "spec_bench" / "question.jsonl").read_text().splitlines()
        texts = [" ".join(json.loads(x)["turns"]) for x in lines if x.strip()]
    except (DataNotFoundError, OSError):
        if IN_CI:  # CI has the data: a fallback there would hide a broken set-up
            raise
        texts = [f"Note {i}: the {i}th item of the list costs {i * 3} euros." for i in range(500)]
    return [f"[{i}] {texts[i % len(texts)]}" for i in range(n)]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory, engine: Any) -> Path:
    from recallspec.recall.automata import StaticIndex

    root = tmp_path_factory.mktemp("corpora")
    d = root / "allowed"
    (d / "sub").mkdir(parents=True)
    tok, vocab = engine.tokenizer, int(engine.model.config.vocab_size)
    (d / "notes.txt").write_text(f"{PASSAGE}\n\nA second block of notes.\n")
    (d / "sub" / "docs.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in _docs(20)))
    ids = [tok.encode(t) for t in _docs(200)]
    StaticIndex.build(ids, vocab, tok.fingerprint, d / "good.rsidx")
    StaticIndex.build(ids, vocab, "ab" * 32, d / "other_tokenizer.rsidx")  # another tokenizer's
    good = (d / "good.rsidx").read_bytes()
    (d / "truncated.rsidx").write_bytes(good[: len(good) // 2])
    (d / "corrupt.rsidx").write_bytes(os.urandom(4096))
    (d / "broken.jsonl").write_text('{"text": "fine"}\n{not json\n')
    (d / "binary.txt").write_bytes(bytes(range(128, 256)) * 8)
    (d / "blank.txt").write_text("\n\n  \n\n")
    (root / "secret.txt").write_text("outside the corpus directory\n")
    (d / "escape.txt").symlink_to(root / "secret.txt")
    (d / "sub" / "inside.txt").symlink_to(d / "notes.txt")  # a link that stays inside: fine
    return d


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> Iterator[Server]:
    # "sam" drafts deterministically from the request's text, the memory and the corpora,
    # so a corpus's effect shows in the acceptance figures.
    yield from start_server(tmp_path_factory.mktemp("serve") / "server.log",
                            "--drafter", "sam", "--mode", "fixed", "--max-batch-size", "16",
                            "--max-len", "1024",
                            "--memory-tokens", str(MEMORY_TOKENS), "--corpus-dir",
                            str(corpus_dir))


def _client(server: Server, **kw: Any) -> httpx.Client:
    return httpx.Client(base_url=f"{server.base}/v1", timeout=60, **kw)


def wait_ready(c: httpx.Client, cid: str) -> dict[str, Any]:
    """The corpus once it no longer loads (the caller asserts on its status)."""

    def get() -> dict[str, Any]:
        r = c.get(f"/corpora/{cid}")
        assert r.status_code == 200, r.text
        info: dict[str, Any] = r.json()
        return info

    return settled(get, lambda info: info["status"] != "loading")


def corpora_gauges(m: Samples) -> dict[str, float]:
    return {status: total(m, "recallspec:corpora", status=status)
            for status in ("loading", "ready", "failed")}


def test_add_list_get_remove(server: Server) -> None:
    with _client(server) as c:
        assert c.get("/corpora").json() == {"object": "list", "data": []}
        added = []
        for body in ({"name": "inline", "documents": [PASSAGE, "Another document."]},
                     {"name": "notes", "file": "notes.txt"},
                     {"name": "jsonl", "file": "sub/docs.jsonl"},
                     {"name": "linked", "file": "sub/inside.txt"},
                     {"name": "index", "file": "good.rsidx"}):
            r = c.post("/corpora", json=body)
            assert r.status_code == 202, r.text
            info = r.json()
            assert info["object"] == "corpus" and info["name"] == body["name"]
            assert info["status"] in ("loading", "ready") and info["error"] is None
            assert r.headers["location"] == f"/v1/corpora/{info['id']}"
            assert info["kind"] == ("index" if body.get("file") == "good.rsidx" else "documents")
            added.append(info["id"])
        for cid in added:
            info = wait_ready(c, cid)
            assert info["status"] == "ready" and info["tokens"] > 0, info
        listed = c.get("/corpora").json()["data"]
        assert [x["id"] for x in listed] == added
        # The gauges follow the registry (refreshed by the engine thread every
        # STATE_INTERVAL): every corpus ready, none loading or failed, their tokens.
        m = settled(server.metrics, lambda m: corpora_gauges(m)["ready"] == len(added))
        assert corpora_gauges(m) == {"loading": 0, "ready": len(added), "failed": 0}
        assert total(m, "recallspec:corpus_tokens") == sum(x["tokens"] for x in listed)
        for cid in added:
            r = c.delete(f"/corpora/{cid}")
            assert r.status_code == 200 and r.json()["deleted"] is True and r.json()["id"] == cid
            assert c.get(f"/corpora/{cid}").status_code == 404
            assert c.delete(f"/corpora/{cid}").status_code == 404
        assert c.get("/corpora").json()["data"] == []


def _bad_bodies(corpus_dir: Path) -> list[tuple[bytes | dict[str, Any], int, str]]:
    """(body, status, a piece of the message) of requests that must be refused."""
    return [
        (b"{bad json", 400, "not valid JSON"),
        (b"[]", 400, "JSON object"),
        ({}, 400, "name"),
        ({"name": "x"}, 400, "either documents"),
        ({"name": "", "documents": ["a"]}, 400, "name"),
        ({"name": "x", "documents": []}, 400, "documents"),
        ({"name": "x", "documents": "text"}, 400, "documents"),
        ({"name": "x", "documents": [""]}, 400, "documents"),
        ({"name": "x", "documents": ["  ", "\n"]}, 400, "no text"),
        ({"name": "x", "documents": [1]}, 400, "documents"),
        ({"name": "x", "documents": ["a"], "file": "notes.txt"}, 400, "not both"),
        ({"name": "x", "file": "notes.txt", "extra": 1}, 400, "unrecognized"),
        ({"name": "x", "file": "../secret.txt"}, 400, "'..'"),
        ({"name": "x", "file": "sub/../../secret.txt"}, 400, "'..'"),
        ({"name": "x", "file": str(corpus_dir.parent / "secret.txt")}, 400, "absolute"),
        ({"name": "x", "file": str(corpus_dir / "notes.txt")}, 400, "absolute"),
        ({"name": "x", "file": "/etc/passwd"}, 400, "absolute"),
        ({"name": "x", "file": "escape.txt"}, 400, "symlink"),
        ({"name": "x", "file": ""}, 400, "file"),
        ({"name": "x", "file": "sub"}, 400, "not a file"),
        ({"name": "x", "file": "missing.txt"}, 404, "no 'missing.txt'"),
        ({"name": "x", "file": "broken.jsonl"}, 400, "invalid JSON"),
        ({"name": "x", "file": "binary.txt"}, 400, "cannot read"),
        ({"name": "x", "file": "blank.txt"}, 400, "no text"),
        ({"name": "x", "file": "corrupt.rsidx"}, 400, "corrupt.rsidx"),
        ({"name": "x", "file": "truncated.rsidx"}, 400, "truncated.rsidx"),
        ({"name": "x", "file": "other_tokenizer.rsidx"}, 400, "different tokenizer"),
    ]


def test_bad_corpus_requests_get_clear_4xx(server: Server, corpus_dir: Path) -> None:
    with _client(server) as c:
        for body, status, piece in _bad_bodies(corpus_dir):
            r = c.post("/corpora", content=body if isinstance(body, bytes) else json.dumps(body))
            assert r.status_code == status, (body, r.text)
            err = r.json()["error"]
            assert piece in err["message"], (body, err)
            assert err["type"] == ("not_found_error" if status == 404 else
                                   "invalid_request_error")
            if isinstance(body, dict) and str(corpus_dir) not in body.get("file", ""):
                assert str(corpus_dir) not in err["message"]  # no server paths in answers
        for method in ("get", "delete"):
            r = getattr(c, method)("/corpora/corpus-999")
            assert r.status_code == 404 and "corpus-999" in r.json()["error"]["message"]
        assert c.put("/corpora").status_code == 405
        assert c.get("/corpora").json()["data"] == []  # nothing half-added
    server.wait_idle()


# ---- corpora added and removed while 16 streams decode, the loads held -------------------
class _HeldTokenizer(Tokenizer):
    """The model's tokenizer (the same vocabulary and chat template) whose
    ``encode_batch`` - what the corpus loader tokenizes documents with; the server
    encodes requests with ``encode_prompt`` - runs only once ``go`` is set: a corpus's
    background load waits on the test (``loading``: one has begun; ``encoded``: the
    documents it let through). A gate never opened opens itself after GUARD_S and fails
    that load, so a server whose adds or decoding waited for a load fails the test
    instead of hanging it."""

    def __init__(self, base: Tokenizer) -> None:
        super().__init__(HFTokenizer.from_str(base.backend_json()),
                         chat_template=base.chat_template, bos_token=base.bos_token,
                         eos_token=base.eos_token, extra_eos_ids=base.eos_token_ids)
        self.go = threading.Event()
        self.loading = threading.Event()
        self.encoded: list[str] = []

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        self.loading.set()
        if not self.go.wait(GUARD_S):
            self.go.set()
            raise AssertionError("the test never let the load go on")
        self.encoded += texts
        return super().encode_batch(texts)


@contextlib.contextmanager
def serve_here(engine: Any, tokenizer: Tokenizer, corpus_dir: Path) -> Iterator[
        tuple[str, Engine]]:
    """The app of ``recallspec serve`` (sam drafting, 16 slots, no memory) over a new
    engine on the session's model with ``tokenizer``, served by uvicorn in a thread of
    this process: its base URL and engine."""
    import uvicorn

    eng = Engine(engine.model, tokenizer, EngineConfig(
        drafter="sam", mode="fixed", max_batch_size=16, max_len=1024, dtype=TEST_DTYPE))
    loop = EngineLoop(eng, Metrics(MODEL), max_waiting=64)
    app = create_app(loop, model_name=MODEL, corpus_dir=corpus_dir)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections wait in the backlog until uvicorn accepts them
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    loop.start()
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", eng
    finally:
        server.should_exit = True
        thread.join(30)
        loop.stop()
        eng.close()
        sock.close()


@dataclass
class Stream:
    ids: list[int] = field(default_factory=list)
    error: str | None = None
    done: bool = False
    started: asyncio.Event = field(default_factory=asyncio.Event)  # its first tokens (or end)


async def _stream(c: httpx.AsyncClient, prompt: str, max_tokens: int, s: Stream) -> Stream:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
            **ext()}
    try:
        async with c.stream("POST", "/chat/completions", json=body) as r:
            if r.status_code != 200:
                s.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return s
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    s.done = True
                    break
                obj = json.loads(data)
                if "error" in obj:
                    s.error = str(obj["error"])
                    break
                s.ids += [t for ch in obj["choices"] for t in ch.get("token_ids") or []]
                if s.ids:
                    s.started.set()
    finally:
        s.started.set()
    return s


def test_add_and_remove_corpora_while_16_streams_decode(engine: Any, corpus_dir: Path) -> None:
    """Neither an add nor decoding waits for a corpus load. The first corpus's load is
    held (``_HeldTokenizer``) from before 16 streams start until after they all end;
    while they decode, an index file and documents are added (202, "loading", listed
    behind the held load: one loader, in order) and the documents removed before their
    load began. Every stream ends whole with the loads still waiting; then they go on:
    the kept corpora turn ready, and the removed one was never tokenized."""
    TOKENS = 32
    prompts = [f"Tell me a long story about a {a} who finds a {b}." for a, b in zip(
        ("baker", "pilot", "cat", "robot", "gardener", "sailor", "child", "wizard") * 2,
        ("key", "map", "coin", "letter") * 4, strict=True)]
    tok = _HeldTokenizer(engine.tokenizer)

    async def run(base: str) -> tuple[list[Stream], list[str]]:
        async with httpx.AsyncClient(base_url=f"{base}/v1", timeout=600,
                                     limits=httpx.Limits(max_connections=32)) as c:

            async def add(body: dict[str, Any]) -> str:
                r = await c.post("/corpora", json=body)
                assert r.status_code == 202 and r.json()["status"] == "loading", r.text
                return str(r.json()["id"])

            async def listed() -> list[tuple[str, str]]:
                return [(x["id"], x["status"]) for x in (await c.get("/corpora")).json()["data"]]

            held = await add({"name": "notes", "file": "notes.txt"})
            assert await asyncio.to_thread(tok.loading.wait, GUARD_S)  # begun, and waiting
            streams = [Stream() for _ in prompts]
            tasks = [asyncio.create_task(_stream(c, p, TOKENS, s))
                     for p, s in zip(prompts, streams, strict=True)]
            await asyncio.gather(*(s.started.wait() for s in streams))  # all decoding
            idx = await add({"name": "idx", "file": "good.rsidx"})
            extra = await add({"name": "extra", "documents": _docs(300)})
            assert await listed() == [(held, "loading"), (idx, "loading"), (extra, "loading")]
            assert (await c.delete(f"/corpora/{extra}")).status_code == 200
            results = await asyncio.gather(*tasks)
            # Every stream has ended, and the loads still wait (the gate never opened).
            assert not tok.go.is_set()
            assert await listed() == [(held, "loading"), (idx, "loading")]
            return results, [held, idx]

    with serve_here(engine, tok, corpus_dir) as (base, eng):
        results, kept = asyncio.run(run(base))
        assert all(s.error is None and s.done and len(s.ids) == TOKENS for s in results), [
            (s.error, len(s.ids)) for s in results]
        tok.go.set()
        for cid in kept:
            info = eng.corpora.wait(cid, GUARD_S)
            assert info.status == "ready" and info.tokens > 0, info
        assert [s.name for s in eng.corpora.view()] == kept
        assert [c.id for c in eng.corpora.list()] == kept
    assert tok.encoded == read_documents(corpus_dir / "notes.txt")  # not the removed ones


def _spec(r: Any) -> dict[str, Any]:
    return dict((r.model_extra or {})["metrics"]["speculative_decoding"])


def test_used_corpus_keeps_greedy_output(server: Server, engine: Any) -> None:
    quote = f"Repeat this paragraph word for word, then continue it:\n\n{PASSAGE}"
    p = SamplingParams(max_new_tokens=64)
    refs = engine.generate([engine.encode_prompt(q, chat=True) for q in (QUESTION, quote)],
                           p, drafter="sam")  # no corpus, no memory
    client = server.client()

    def ask(prompt: str) -> tuple[list[int], dict[str, Any]]:
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=64,
            temperature=0, extra_body=ext(memory=False))  # the corpus alone is in play
        return list((r.choices[0].model_extra or {})["token_ids"]), _spec(r)

    before = [ask(q) for q in (QUESTION, quote)]
    for (ids, _), ref in zip(before, refs, strict=True):
        assert ids == ref.token_ids
    with _client(server) as c:
        # The corpus holds the model's own answers (the second quotes the passage).
        info = c.post("/corpora", json={"name": "answers", "documents": [
            r.text for r in refs]}).json()
        assert wait_ready(c, info["id"])["status"] == "ready"
        after = [ask(q) for q in (QUESTION, quote)]
        assert c.delete(f"/corpora/{info['id']}").status_code == 200
    removed = [ask(q) for q in (QUESTION, quote)]
    for (ids, _), (ids2, spec2), (_, spec0), ref in zip(after, removed, before, refs,
                                                        strict=True):
        assert ids == ref.token_ids and ids2 == ref.token_ids  # lossless
        assert spec2 == spec0  # once removed, drafting is as before
    # The corpus was drafted from (the quote is mostly in the prompt already: the
    # request's own text drafts it with or without the corpus).
    assert after[0][1]["num_steps"] < before[0][1]["num_steps"], (after[0], before[0])
    assert after[1][1]["num_steps"] <= before[1][1]["num_steps"]
    server.wait_idle()


def test_tenants_memories_are_apart(server: Server, engine: Any) -> None:
    question = "Explain in a few sentences why the sky is blue."
    ref = engine.generate(engine.encode_prompt(question, chat=True),
                          SamplingParams(max_new_tokens=48), drafter="sam")
    client = server.client()

    def ask(**kw: Any) -> dict[str, Any]:
        user = kw.pop("user", None)
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=48,
            temperature=0, extra_body=ext(**kw), **({"user": user} if user else {}))
        assert (r.choices[0].model_extra or {})["token_ids"] == ref.token_ids  # lossless
        return _spec(r)

    first = ask(user="alice")
    # Her output is built into her memory in the background: soon her requests draft
    # from it (fewer steps for the same tokens).
    again = settled(lambda: ask(user="alice"), lambda s: s["num_steps"] < first["num_steps"])
    assert again["num_steps"] < first["num_steps"], "alice's memory was never drafted from"
    # Every request of hers adds her answer again (and a segment may still be building),
    # so her step count may drop further before it settles: wait for two equal in a row.
    steps = settled(lambda: (ask(user="alice")["num_steps"], ask(user="alice")["num_steps"]),
                    lambda pair: pair[0] == pair[1])
    assert steps[0] == steps[1], f"alice's memory never settled: {steps}"
    assert ask(tenant="alice")["num_steps"] == steps[1]  # the same tenant
    assert ask(user="bob", tenant="alice")["num_steps"] == steps[1]  # tenant wins
    assert ask(user="bob") == first  # another tenant never drafts from alice's memory
    assert ask(user="alice", memory=False) == first  # memory off for this request
    # The gauges follow the memory at the engine loop's next refresh and bob's answer is
    # built in the background: read them once both tenants show (a guard only on hangs).
    m = settled(server.metrics, lambda m: total(m, "recallspec:memory_tenants") >= 2)
    assert total(m, "recallspec:memory_budget_tokens") == MEMORY_TOKENS
    tenants = total(m, "recallspec:memory_tenants")
    assert tenants >= 2  # alice and bob at least
    assert 0 < total(m, "recallspec:memory_tokens") <= tenants * MEMORY_TOKENS
    server.wait_idle()


# ---- the API key, and a server without a corpus directory or memory ----------------------
@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Server]:
    yield from start_server(tmp_path / "server.log", "--api-key", "sesame",
                            "--max-batch-size", "1")


def test_api_key_and_no_corpus_dir(guarded: Server) -> None:
    server = guarded
    with _client(server) as c:
        for method, path in (("get", "/corpora"), ("post", "/corpora"),
                             ("get", "/corpora/corpus-1"), ("delete", "/corpora/corpus-1")):
            r = c.request(method.upper(), path, json={"name": "x", "documents": ["a"]})
            assert r.status_code == 401, (method, path, r.text)
    with _client(server, headers={"Authorization": "Bearer sesame"}) as c:
        r = c.post("/corpora", json={"name": "x", "file": "notes.txt"})
        assert r.status_code == 400 and "--corpus-dir" in r.json()["error"]["message"]
        r = c.post("/corpora", json={"name": "x", "documents": [PASSAGE]})
        assert r.status_code == 202, r.text
        assert wait_ready(c, r.json()["id"])["status"] == "ready"
        # Memory off on this server: tenants and the memory switch are accepted all the same.
        r = c.post("/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 4,
            "user": "carol", "recallspec": {"tenant": "dave", "memory": False}})
        assert r.status_code == 200, r.text
        for bad in ({"tenant": ""}, {"tenant": 5}, {"memory": "no"}, {"tenant": "x" * 300}):
            r = c.post("/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "Hi!"}],
                "max_tokens": 4, "recallspec": bad})
            assert r.status_code == 400, (bad, r.text)
    assert total(server.metrics(), "recallspec:memory_budget_tokens") == 0


def test_memory_snapshot_survives_a_restart(tmp_path: Path, engine: Any) -> None:
    question = "Name three uses of copper and explain each in a sentence."
    ref = engine.generate(engine.encode_prompt(question, chat=True),
                          SamplingParams(max_new_tokens=40), drafter="sam")
    snap = tmp_path / "memory.snap"
    args = ("--drafter", "sam", "--mode", "fixed", "--max-batch-size", "1",
            "--memory-tokens", "10000",
            "--memory-snapshot", str(snap))

    def ask(server: Server) -> dict[str, Any]:
        r = server.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=40,
            temperature=0, user="erin", extra_body=ext())
        assert (r.choices[0].model_extra or {})["token_ids"] == ref.token_ids
        return _spec(r)

    serve = contextlib.contextmanager(start_server)
    with serve(tmp_path / "first.log", *args) as server:
        cold = ask(server)
        # The answer goes into erin's memory in the background.
        m = settled(server.metrics,
                    lambda m: total(m, "recallspec:memory_tokens") >= len(ref.token_ids))
        assert total(m, "recallspec:memory_tokens") >= len(ref.token_ids)
    # Stopped with SIGTERM: the server saved its memory on the way out.
    assert snap.is_file() and snap.stat().st_size > 0
    with serve(tmp_path / "second.log", *args) as server:
        # The snapshot is built in the background.
        m = settled(server.metrics,
                    lambda m: total(m, "recallspec:memory_tokens") >= len(ref.token_ids))
        assert total(m, "recallspec:memory_tokens") >= len(ref.token_ids), (
            "the restarted server forgot erin's answers")
        # Its first request already drafts from what the first server remembered.
        assert ask(server)["num_steps"] < cold["num_steps"]
