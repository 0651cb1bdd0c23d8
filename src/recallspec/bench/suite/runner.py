"""Running a suite: every method answers every question, one flushed answer line each.

Order per method: build it, warm it up (untimed), then answer the questions in suite
order. A multi-turn question is answered turn by turn, each turn's prompt built from
the method's own earlier answers. With ``repeats > 1`` the whole question is answered
``repeats`` times and each turn's wall time is the median; the tokens of the first
repeat are kept (under greedy decoding every repeat yields the same tokens).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from recallspec.bench.common.answers import (
    AnswerWriter,
    answers_path,
    iter_answer_files,
    read_answers,
)
from recallspec.bench.common.machine import machine_info
from recallspec.bench.common.method import (
    LEGACY_SIZING_DEFAULT,
    SIZING_DEFAULT_KEY,
    Method,
    TurnOutput,
)
from recallspec.bench.common.prompting import conversation_ids
from recallspec.bench.common.suites import Question, SuiteSelection, load_suite
from recallspec.bench.peers.methods import PeerCrashed
from recallspec.bench.suite.methods import MethodFactory, check_method_names
from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import Engine
from recallspec.errors import DataError, RecallspecError
from recallspec.params import DEFAULT_SIZING, DEFAULT_WEIGHT_FORMAT, MAX_DRAFT_NODES, Sizing


@dataclass(frozen=True)
class BenchConfig:
    suite: str
    methods: tuple[str, ...]
    model: str | None = None
    selection: SuiteSelection = field(default_factory=SuiteSelection)
    max_new_tokens: int = 128
    repeats: int = 1
    temperature: float = 0.0
    max_draft_nodes: int = MAX_DRAFT_NODES
    dtype: str = DEFAULT_WEIGHT_FORMAT
    data_dir: str | None = None

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise DataError("--repeats must be >= 1")
        if self.max_new_tokens < 1:
            raise DataError("--max-new-tokens must be >= 1")
        if self.temperature < 0:
            raise DataError("--temperature must be >= 0")
        if not self.methods:
            raise DataError("no methods given")

    def comparable(self, sizing_default: Sizing = DEFAULT_SIZING) -> dict[str, Any]:
        """Settings that must match between a run and its --resume. ``sizing_default``:
        how the run's engine sizes a method named without a sizing (``pld``), recorded so
        that one method name never labels answers of two sizings (``bench/common/method.py``)."""
        return {
            "suite": self.suite, "model": self.model, "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature, "max_draft_nodes": self.max_draft_nodes,
            "dtype": self.dtype, SIZING_DEFAULT_KEY: sizing_default,
        }


Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def question_seed(qid: int | str) -> int:
    """A fixed per-question sampling seed, so that sampled runs are reproducible."""
    return zlib.crc32(str(qid).encode())


def engine_sizing_default(engine: Any) -> Sizing:
    """How the engine answering a run sizes a method named without a sizing: as its
    config's mode says where it states one (a caller's engine, e.g. ``mode="fixed"``),
    else DEFAULT_SIZING (``run_bench``'s own ``Engine.load`` states no mode)."""
    sizing = None if engine is None else engine.config.default_sizing
    return DEFAULT_SIZING if sizing is None else sizing


def _check_run_file(out: Path, cfg: BenchConfig, resume: bool,
                    sizing_default: Sizing = DEFAULT_SIZING) -> None:
    """Refuse to add to ``out`` answers whose settings differ from its run.json's (on
    --resume: any comparable setting; always: the sizing semantics, since this run
    rewrites run.json, which then labels the answers left in ``out`` too), then write
    this run's run.json."""
    path = out / "run.json"
    old: dict[str, Any] | None = None
    if path.is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            if resume:
                raise DataError(f"{path}: corrupt ({e.msg})") from None
    if old is None:
        _write_run_file(path, cfg, sizing_default)
        return
    settings = dict(old.get("settings", {}))
    legacy = SIZING_DEFAULT_KEY not in settings  # written before the key: unlabeled = fixed
    was = settings.setdefault(SIZING_DEFAULT_KEY, LEGACY_SIZING_DEFAULT)
    if was != sizing_default and (resume or any(iter_answer_files(out))):
        why = (f"{path} was written before cost-aware sizing became the default of every "
               "drafter: its methods named without a sizing (pld, llma, ...) were sized "
               f"{was}" if legacy else
               f"{path} records methods named without a sizing as sized {was}")
        raise DataError(
            f"{why}, and this run would add {sizing_default} answers under the same names "
            "(or relabel those answers). Run into a fresh --out, or pass --overwrite (not "
            "--resume) to discard its answers; name methods NAME:mode=fixed or "
            "NAME:mode=adaptive to state their sizing")
    if resume:
        mismatch = {
            k: (settings.get(k), v) for k, v in cfg.comparable(sizing_default).items()
            if settings.get(k) != v
        }
        if mismatch:
            desc = ", ".join(f"{k}: was {a!r}, now {b!r}" for k, (a, b) in mismatch.items())
            raise DataError(f"--resume with different settings than {path} ({desc})")
    _write_run_file(path, cfg, sizing_default)


def _write_run_file(path: Path, cfg: BenchConfig, sizing_default: Sizing) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"settings": cfg.comparable(sizing_default), "config": _jsonable(asdict(cfg)),
            "machine_at_start": machine_info()}
    path.write_text(json.dumps(meta, indent=2), encoding="utf-8")


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


@dataclass(frozen=True)
class Answered:
    outs: list[TurnOutput]  # per turn, first repeat
    prompts: list[list[int]]  # prompt ids per turn, first repeat
    times: list[list[float]]  # wall time [turn][repeat]
    agree: bool  # every repeat produced the same tokens


def answer_question(
    method: Method, tokenizer: Any, q: Question, params: SamplingParams, repeats: int
) -> Answered:
    first: list[TurnOutput] = []
    prompts: list[list[int]] = []
    times: list[list[float]] = [[] for _ in q.turns]
    agree = True
    for r in range(repeats):
        answers: list[str] = []
        outs: list[TurnOutput] = []
        for t in range(len(q.turns)):
            ids = conversation_ids(tokenizer, q.turns[: t + 1], answers)
            if r == 0:
                prompts.append(ids)
            o = method.generate(ids, params)
            outs.append(o)
            answers.append(o.text)
            times[t].append(o.wall_time)
        if r == 0:
            first = outs
        elif [o.token_ids for o in outs] != [o.token_ids for o in first]:
            agree = False
    return Answered(first, prompts, times, agree)


def make_record(
    method: Method, model_id: str, q: Question, a: Answered, eos_token_ids: Sequence[int]
) -> dict[str, Any]:
    outs, times = a.outs, a.times
    return {
        "question_id": q.question_id,
        "category": q.category,
        "subcategory": q.subcategory,
        "answer_id": f"{method.name}-{q.question_id}",
        "model_id": model_id,
        "method": method.name,
        "baseline": method.baseline,
        "eos_token_ids": sorted(int(e) for e in eos_token_ids),
        "choices": [
            {
                "index": 0,
                "turns": [o.text for o in outs],
                "decoding_steps": [len(o.accept_lengths) for o in outs],
                "new_tokens": [len(o.token_ids) for o in outs],
                "wall_time": [statistics.median(ts) for ts in times],
                "accept_lengths": [a for o in outs for a in o.accept_lengths],
                "token_ids": [o.token_ids for o in outs],
                "prompt_tokens": [o.prompt_tokens for o in outs],
                "prompt_ids": a.prompts,
                "finish_reason": [o.finish_reason for o in outs],
                "wall_time_repeats": times,
                "repeats_agree": a.agree,
                **({"timing": [o.timing for o in outs]}
                   if all(o.timing is not None for o in outs) else {}),
                # A native llama.cpp peer's timings per turn (first repeat; wall_time
                # above is the server's own prefill + decode time).
                **({"peer": [o.peer for o in outs]}
                   if all(o.peer is not None for o in outs) else {}),
            }
        ],
        "tstamp": time.time(),
    }


def run_bench(
    cfg: BenchConfig, out: Path, *, resume: bool = False, overwrite: bool = False,
    engine: Any = None, log: Log = _stderr, progress: bool = True,
    factory: MethodFactory | None = None,
) -> list[str]:
    """Run (or resume) a suite into ``out``; returns the methods that ran (a peer whose
    process crashed is logged and dropped; the others go on). ``engine``: an ``Engine``
    (or a stand-in with its ``tokenizer``, ``threads`` and ``config``); None: loaded."""
    questions = load_suite(cfg.suite, cfg.selection, cfg.data_dir)
    methods, skipped = check_method_names(cfg.methods)
    for msg in skipped:
        log(msg)
    # Refuse to touch completed answers unless told: read (and validate) every file
    # first, so a corrupt one fails before any model is loaded.
    done: dict[str, set[str]] = {}
    if overwrite:
        # The whole earlier run, not only the methods listed now: the report covers
        # every answer file in ``out``, and a method left from before would join it.
        for _, p in iter_answer_files(out):
            p.unlink()
    for m in methods:
        p = answers_path(out, m)
        if p.exists() and p.stat().st_size > 0:
            if not resume:
                raise DataError(
                    f"{p} already holds answers; pass --resume to continue it, "
                    "--overwrite to start over, or another --out"
                )
            else:
                done[m] = {str(r["question_id"]) for r in read_answers(p)}
    _check_run_file(out, cfg, resume, engine_sizing_default(engine))
    if engine is None:
        log(f"loading model {cfg.model or '(default)'} ({cfg.dtype})")
        engine = Engine.load(cfg.model, dtype=cfg.dtype, max_draft_nodes=cfg.max_draft_nodes)
        engine.wait_for_repack_cache()  # a first load's cache write: before any timing
    model_id = _model_id(cfg.model)
    factory = factory or MethodFactory(engine, cfg.model, cfg.dtype)
    ready: list[Method] = []
    try:
        for name in methods:
            if all(str(q.question_id) in done.get(name, set()) for q in questions):
                log(f"{name}: all {len(questions)} questions already answered")
                continue
            try:
                created = factory.create(name)
            except PeerCrashed as e:
                log(f"{name} failed and is dropped from this run: {e}")
                continue
            except ImportError as e:
                log(f"skipping {name}: {e}")
                continue
            ready.append(created)
            _record_info(out, name, created)
            try:
                _warm_up(created, engine.tokenizer, questions[0], cfg)
            except PeerCrashed as e:
                log(f"{name} failed and is dropped from this run: {e}")
                _close(ready.pop())
                continue
        _run_interleaved(
            ready, engine.tokenizer, questions, done, cfg, out, model_id, log, progress
        )
    finally:
        for r in ready:
            _close(r)
    return methods


def _record_info(out: Path, name: str, method: Method) -> None:
    """Add what a method says about itself (a native peer: its commit, build flags and
    ``system_info`` line, ``bench/common/llamacpp.py:peer_info``) to ``run.json``'s
    ``methods_info``, so that the report names the exact peer binary that answered."""
    info = getattr(method, "info", None)
    if not info:
        return
    path = out / "run.json"
    meta = json.loads(path.read_text(encoding="utf-8"))
    meta.setdefault("methods_info", {})[name] = _jsonable(info)
    path.write_text(json.dumps(meta, indent=2), encoding="utf-8")


def _close(method: Method) -> None:
    close = getattr(method, "close", None)
    if callable(close):
        close()


def _params(cfg: BenchConfig, q: Question) -> SamplingParams:
    return SamplingParams(
        temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
        seed=question_seed(q.question_id) if cfg.temperature > 0 else None,
    )


def _warm_up(method: Method, tokenizer: Any, q: Question, cfg: BenchConfig) -> None:
    # Untimed: first-call costs (allocator growth, lazy init, kernel selection).
    ids = conversation_ids(tokenizer, q.turns[:1], [])
    method.generate(ids, SamplingParams(max_new_tokens=min(16, cfg.max_new_tokens)))


def _run_interleaved(
    methods: Sequence[Method], tokenizer: Any, questions: Sequence[Question],
    done: dict[str, set[str]], cfg: BenchConfig, out: Path, model_id: str, log: Log,
    progress: bool,
) -> None:
    """Answer question by question, every method in turn: background load on a noisy
    machine then slows all methods alike instead of whichever ran at that time, so the
    speedups (ratios within the run) stay fair."""
    pending = {m.name: {str(q.question_id) for q in questions} - done.get(m.name, set())
               for m in methods}
    crashed: set[str] = set()
    tokens = dict.fromkeys(pending, 0)
    seconds = dict.fromkeys(pending, 0.0)
    with ExitStack() as stack, tqdm(
        total=sum(len(p) for p in pending.values()), desc="answers", unit="q", file=sys.stderr,
        disable=not progress, dynamic_ncols=True,
    ) as bar:
        writers = {m.name: stack.enter_context(AnswerWriter(answers_path(out, m.name)))
                   for m in methods}
        for q in questions:
            for method in methods:
                if method.name in crashed or str(q.question_id) not in pending[method.name]:
                    continue
                try:
                    answered = answer_question(method, tokenizer, q, _params(cfg, q), cfg.repeats)
                except PeerCrashed as e:  # that method is over; the others go on
                    log(f"{method.name} failed and is dropped from this run: {e}")
                    crashed.add(method.name)
                    bar.update(len(pending[method.name]))
                    continue
                except RecallspecError as e:  # e.g. a prompt longer than the context
                    log(f"{method.name}: question {q.question_id} skipped: {e}")
                    pending[method.name].discard(str(q.question_id))
                    bar.update(1)
                    continue
                pending[method.name].discard(str(q.question_id))
                rec = make_record(method, model_id, q, answered, tokenizer.eos_token_ids)
                writers[method.name].write(rec)
                c = rec["choices"][0]
                tokens[method.name] += sum(c["new_tokens"])
                seconds[method.name] += sum(c["wall_time"])
                bar.set_postfix_str(" ".join(
                    f"{n}={tokens[n] / seconds[n]:.1f}" for n in tokens if seconds[n]
                ) + " tok/s")
                bar.update(1)


def _model_id(spec: str | None) -> str:
    return Path(spec).name if spec else "SmolLM2-135M-Instruct"
