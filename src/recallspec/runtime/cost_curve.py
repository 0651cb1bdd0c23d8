"""The verification cost curve: seconds for one forward of T new rows on this machine.

Speculation pays only when the extra accepted tokens outweigh the extra rows a draft
adds to the forward. On a CPU that trade-off depends on the model, the dtype, the
thread count and the matmul library (e.g. MKL is slow for 2-3 rows), so it is measured,
not modelled: one chain of T rows after a cached prefix, for a grid of T, plus the
extra cost of each additional sequence in a batch (its own attention call and mask).
Curves are cached per model, dtype, thread count, CPU and torch version.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from recallspec.runtime.batch import SequenceInput, build_batch
from recallspec.runtime.linear import forward_threads
from recallspec.runtime.threads import decode_threads

CURVE_FORMAT = 2  # 2: large forwards measured with torch's threads (forward_threads)
DEFAULT_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass(frozen=True)
class CostCurve:
    """cost(T, B) = interpolation of ``seconds`` over ``tokens`` + (B - 1) * per_seq."""

    tokens: tuple[int, ...]  # [K] forward sizes measured, strictly increasing, tokens[0] == 1
    seconds: tuple[float, ...]  # [K] median seconds of one forward of that many rows
    per_seq: float  # extra seconds per additional sequence in the same forward
    key: str = ""  # what the curve was measured for (model, dtype, threads, machine)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.seconds) or not self.tokens:
            raise ValueError("cost curve needs one time per size")
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:], strict=False)):
            raise ValueError("cost curve sizes must be strictly increasing")

    def __call__(self, rows: int, seqs: int = 1) -> float:
        return self.rows_cost(rows) + max(seqs - 1, 0) * self.per_seq

    def rows_cost(self, rows: int) -> float:
        ts, ss = self.tokens, self.seconds
        if rows <= ts[0]:
            return ss[0]
        i = bisect_left(ts, rows)
        if i == len(ts):  # extrapolate with the last segment's slope
            i = len(ts) - 1
        t0, t1, s0, s1 = ts[i - 1], ts[i], ss[i - 1], ss[i]
        return s0 + (s1 - s0) * (rows - t0) / (t1 - t0)

    def to_json(self) -> dict[str, Any]:
        return {"format": CURVE_FORMAT, **asdict(self)}

    @staticmethod
    def from_json(d: dict[str, Any]) -> CostCurve:
        if d.get("format") != CURVE_FORMAT:
            raise ValueError("cost curve file has another format")
        return CostCurve(tuple(int(t) for t in d["tokens"]), tuple(float(s) for s in d["seconds"]),
                         float(d["per_seq"]), str(d.get("key", "")))


def median_time(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def forward_times(
    model: Any, cache: Any, threads: int, sizes: Sequence[int], *, cached: int = 256,
    repeats: int = 3, warmup: int = 1,
) -> dict[int, float]:
    """Median seconds of one forward of a chain of T new rows (all rows' logits) after
    ``cached`` random tokens, for each T in ``sizes``, with the engine's thread set-up.
    Needs one free slot of ``cache`` with room for cached + max(sizes) positions."""
    vocab = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, vocab, (cached + max(sizes),), generator=g).tolist()
    slot = cache.allocate()
    out: dict[int, float] = {}
    try:
        with torch.inference_mode():
            for s in range(0, cached, 256):
                toks = ctx[s : min(s + 256, cached)]
                model(build_batch([SequenceInput(slot, s, toks, logits="none")]), cache)
                cache.commit(slot, s, range(len(toks)))
            for k in sizes:
                # Rows past the cached length are scratch: never committed, overwritten.
                meta = build_batch([SequenceInput(slot, cached, ctx[cached : cached + k])])

                def fwd(m: Any = meta) -> Any:
                    with decode_threads(threads), forward_threads(m.num_tokens, threads):
                        return model(m, cache)

                out[k] = median_time(fwd, repeats, warmup)
    finally:
        cache.release(slot)
    return out


def _per_seq_cost(model: Any, threads: int, seqs: int, cached: int, repeats: int) -> float:
    """(t(seqs sequences x 1 row) - t(1 sequence x seqs rows)) / (seqs - 1)."""
    cache = model.new_cache(seqs, cached + seqs + 1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, int(model.config.vocab_size), (cached,), generator=g).tolist()
    slots = [cache.allocate() for _ in range(seqs)]
    with torch.inference_mode():
        for s in slots:
            model(build_batch([SequenceInput(s, 0, ids, logits="none")]), cache)
            cache.commit(s, 0, range(cached))
        many = build_batch([SequenceInput(s, cached, [ids[0]]) for s in slots])
        one = build_batch([SequenceInput(slots[0], cached, ids[:seqs])])

        def run(m: Any) -> Callable[[], Any]:
            def f() -> Any:
                with decode_threads(threads), forward_threads(m.num_tokens, threads):
                    return model(m, cache)
            return f

        t_many = median_time(run(many), repeats)
        t_one = median_time(run(one), repeats)
    return max(t_many - t_one, 0.0) / (seqs - 1)


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _busy() -> bool:
    """1-min load above 1.5 runnable tasks per CPU beyond our own."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return False
    return load > 1.5 * (os.cpu_count() or 1) + 1


def curve_key(model: Any, tokenizer_fingerprint: str, threads: int) -> str:
    """What a curve was measured for: the model (its tokenizer, shape and weight format),
    the thread count, the CPU and torch."""
    c = model.config
    fmt = getattr(model, "weight_format", None) or str(getattr(model, "dtype", ""))
    parts = [
        tokenizer_fingerprint, str(c.num_layers), str(c.hidden_size), str(c.vocab_size), fmt,
        str(threads), cpu_model(), torch.__version__,
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def calibrate(
    model: Any, threads: int, *, key: str = "", sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 3, cache_path: Path | None = None, say: Callable[[str], None] | None = None,
) -> CostCurve:
    """The model's cost curve with ``threads`` cores: read from ``cache_path`` when it was
    measured for the same ``key`` (``curve_key``), else measured (about 10-20 s) and
    written there."""
    if cache_path is not None and cache_path.is_file():
        try:
            curve = CostCurve.from_json(json.loads(cache_path.read_text()))
            if curve.key == key:
                return curve
        except (ValueError, KeyError, TypeError, json.JSONDecodeError):
            pass  # stale or corrupt: measure again
    if say:
        say("calibrating the verification cost curve of this model on this machine ...")
    # A curve measured while other jobs load the CPU is wrong for good (2-thread steps
    # stall on descheduled peers); such a curve serves this process but is not cached.
    busy = _busy()
    scratch = model.new_cache(1, 256 + max(sizes) + 1)
    times = forward_times(model, scratch, threads, sizes, repeats=repeats)
    per_seq = _per_seq_cost(model, threads, 8, 128, repeats)
    curve = CostCurve(tuple(sorted(times)), tuple(times[k] for k in sorted(times)), per_seq, key)
    if busy or _busy():
        if say:
            say("the machine is busy: the cost curve is used now but not cached")
    elif cache_path is not None:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(curve.to_json(), indent=1))
        tmp.replace(cache_path)
    return curve
