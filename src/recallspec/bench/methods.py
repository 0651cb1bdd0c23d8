"""Benchmark methods: one way of generating a turn from prompt token ids.

Names:
  ``ar``                      our engine, no drafter (the run's reference)
  any registered drafter      our engine with that drafter (``pld``, ``llma``, ...)
  ``hf-greedy`` / ``hf-pld``  transformers ``generate`` on the same (fp32 reference)
                              weights and prompt ids (``prompt_lookup_num_tokens=10``)
  ``llamacpp-greedy``         native llama.cpp (``llama-server``, built by ``make peers``)
                              on the GGUF file: same prompt ids and threads, flash
                              attention on, prompt cache off, one slot (its own
                              quantised kernels: NOT the same arithmetic, so only its
                              speedup vs its own greedy counts)
  ``llamacpp-<type>``         the same server with its n-gram speculation ``--spec-type
                              <type>`` (``ngram-simple``, ``ngram-mod``, ``ngram-map-k``,
                              ``ngram-map-k4v``, ``ngram-cache``); baseline
                              ``llamacpp-greedy``, whose answers they should repeat

Peers run in child processes (``bench/peers.py``): a crashing peer fails alone.

Our engine's methods are drafter specs (``drafters/spec.py``): options after the name,
``:key=value`` each, and the draft sizing, cost-aware unless ``:mode=fixed`` (e.g.
``sam+recycling:index=corpus.rsidx:delta=3``, ``pld:mode=fixed``). Values are ints,
floats, true/false/none or strings. The method's name, as written, labels its answers.
A run records in run.json what a method named without a sizing meant
(``SIZING_DEFAULT_KEY``): answers written before cost-aware sizing became the default
hold fixed-size ``pld``; ``recorded_sizing_default`` reads either kind of directory.

Every method's ``baseline`` is its own plain greedy decoding: a peer's speedup and
token identity are measured against that, and ours against ``ar``.
"""

from __future__ import annotations

import importlib.util
import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from recallspec.bench.llamacpp import SPEC_TYPES
from recallspec.bench.llamacpp import available as llamacpp_available
from recallspec.drafters.spec import NO_DRAFTER, DrafterSpec
from recallspec.errors import DataError, UnknownNameError
from recallspec.params import DEFAULT_SIZING, SIZINGS, Sizing
from recallspec.spec.sampling import SamplingParams

HF_METHODS = ("hf-greedy", "hf-pld")
LLAMACPP_METHODS = ("llamacpp-greedy", *(f"llamacpp-{t}" for t in SPEC_TYPES))
HF_PLD_TOKENS = 10


@dataclass(frozen=True)
class TurnOutput:
    token_ids: list[int]  # generated ids, EOS excluded
    text: str
    accept_lengths: list[int]  # committed tokens per decoding step after the prefill token
    wall_time: float  # seconds, prefill included
    prompt_tokens: int
    finish_reason: str
    # Our engine's split of the turn (``engine_timing``; None for peers): what policy
    # replay's time model is fitted on (bench/replay_fit.py).
    timing: dict[str, float] | None = None
    # A native llama.cpp peer's own account of the turn (``llamacpp.Completion.record``:
    # the server's timings, its stop type, the client-side time); None otherwise.
    peer: dict[str, Any] | None = None


def engine_timing(stats: Any) -> dict[str, float]:
    """A turn's split from ``Engine.stats`` (batch 1: counters since ``generate`` began):
    decoding steps, rows fed to them, seconds inside their forwards, seconds drafting,
    and the decode-only steps' whole wall time (the rest of the turn is the prefill)."""
    return {"steps": float(stats.steps), "rows": float(stats.rows),
            "forward_s": float(stats.forward_s), "draft_s": float(stats.draft_s),
            "decode_s": float(stats.decode_only_s)}


class Method(Protocol):
    name: str
    baseline: str

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> TurnOutput: ...


# A method named without a sizing (``pld``) is sized as the engine sizes any drafter
# named without one, DEFAULT_SIZING; a run writes that into its run.json's settings under
# this key (``BenchConfig.comparable``). A run.json written before cost-aware sizing became
# the default lacks the key, and its unlabeled methods were sized fixed
# (LEGACY_SIZING_DEFAULT): whoever reads recorded answers (--resume, replay, bench scale's
# prediction) reads an unlabeled method with its own directory's meaning.
SIZING_DEFAULT_KEY = "sizing_default"
LEGACY_SIZING_DEFAULT: Sizing = "fixed"


def recorded_sizing_default(settings: Mapping[str, Any]) -> Sizing:
    """The sizing of a method named without one in the run whose run.json ``settings``
    these are: as recorded; LEGACY_SIZING_DEFAULT where the run.json predates the key;
    DEFAULT_SIZING where there is no run.json ({}: nothing recorded says otherwise)."""
    if not settings:
        return DEFAULT_SIZING
    value = settings.get(SIZING_DEFAULT_KEY, LEGACY_SIZING_DEFAULT)
    for sizing in SIZINGS:
        if value == sizing:
            return sizing
    raise DataError(f"run.json: unknown {SIZING_DEFAULT_KEY} {value!r} "
                    f"(known: {', '.join(SIZINGS)})")


def method_spec(name: str, sizing_default: Sizing | None = None) -> DrafterSpec:
    """A method name parsed into a drafter spec (``ar`` is plain decoding, ``none``).
    ``sizing_default``: the sizing of a name that states none (None: left unstated, for
    the engine to decide, i.e. DEFAULT_SIZING)."""
    spec = DrafterSpec.parse(name)
    if spec.name == "ar":
        return DrafterSpec(NO_DRAFTER, spec.options)
    if spec.sizing is None and sizing_default is not None:
        return replace(spec, sizing=sizing_default)
    return spec


def baseline_of(name: str) -> str:
    if name.startswith("hf-"):
        return "hf-greedy"
    if name.startswith("llamacpp-"):
        return "llamacpp-greedy"
    return "ar"


def check_method_names(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """(runnable names, skip messages); unknown names or options raise clear errors."""
    from recallspec.drafters import available_drafters, create_drafter

    drafters = available_drafters()
    known = ["ar", *[d for d in drafters if d != NO_DRAFTER], *HF_METHODS, *LLAMACPP_METHODS]
    bases = []
    for name in names:
        spec = DrafterSpec.parse(name)  # a bad option or sizing fails here
        bases.append(spec.name)
        if spec.name in HF_METHODS or spec.name in LLAMACPP_METHODS:
            if name != spec.name:
                raise DataError(f"method {name!r}: peer methods take no options")
        elif spec.name in drafters and spec.options:
            create_drafter(spec.name, **spec.kwargs)  # bad options fail now, not later
    unknown = [n for n, b in zip(names, bases, strict=True)
               if b not in known and n != NO_DRAFTER]
    if unknown:
        raise UnknownNameError(
            f"unknown method(s) {', '.join(unknown)}; available: {', '.join(known)}"
        )
    if len(set(names)) != len(names):
        raise DataError("a method is listed twice")
    run, skipped = [], []
    for n in names:
        if n in LLAMACPP_METHODS and not llamacpp_available():
            skipped.append(f"skipping {n}: native llama.cpp is not built (make peers)")
            continue
        if n in HF_METHODS and importlib.util.find_spec("transformers") is None:
            raise DataError(f"method {n} needs transformers: pip install 'recallspec[hf]'")
        run.append("ar" if n == "none" else n)
    return run, skipped


# ---- our engine ------------------------------------------------------------------


class EngineMethod:
    def __init__(self, engine: Any, name: str) -> None:
        self.engine = engine
        self.name = name  # as written: the answers' label
        self.baseline = "ar"
        self._spec = method_spec(name)  # parsed once; the engine takes the object

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> TurnOutput:
        # Every turn from a cold prefill, as the peers answer (llama-server without
        # cache_prompt, llama-cpp-python reset): with the engine's prefix cache a method
        # would start from the KV an earlier method (or turn) left for the same prompt.
        res = self.engine.generate(prompt_ids, params, drafter=self._spec, prefix_cache=False)
        timing = {**engine_timing(self.engine.stats), "cached_tokens": float(res.cached_tokens)}
        return TurnOutput(
            list(res.token_ids), res.text, list(res.accept_lengths), float(res.wall_time),
            int(res.prompt_tokens), str(res.finish_reason), timing,
        )


# ---- transformers --------------------------------------------------------------


class HFMethod:
    """transformers ``generate``; accept lengths come from counting its forwards."""

    def __init__(self, hf_model: Any, tokenizer: Any, name: str) -> None:
        self.model = hf_model
        self.tokenizer = tokenizer
        self.name = name
        self.baseline = "hf-greedy"
        self._pld = name == "hf-pld"
        self._starts: list[int] = []

    def _record(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # Cache length before each forward = committed tokens - 1 (the last committed
        # token is fed, not cached), so consecutive differences are accept lengths.
        cp = kwargs.get("cache_position")
        if cp is not None and cp.numel():
            self._starts.append(int(cp[0]))
        else:
            pkv = kwargs.get("past_key_values")
            self._starts.append(int(pkv.get_seq_length()) if pkv is not None else 0)

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> TurnOutput:
        import torch

        eos = sorted(self.tokenizer.eos_token_ids)
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        kw: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "eos_token_id": eos if not params.ignore_eos else None,
            "pad_token_id": eos[0] if eos else 0,
        }
        if params.greedy:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            torch.manual_seed(params.seed if params.seed is not None else 0)
            kw.update(
                do_sample=True, temperature=params.temperature,
                top_k=params.top_k or None, top_p=params.top_p,
            )
        if self._pld:
            kw["prompt_lookup_num_tokens"] = HF_PLD_TOKENS
        self._starts = []
        # The hook lives only during this call: hf-greedy and hf-pld share the model.
        hook = self.model.register_forward_pre_hook(self._record, with_kwargs=True)
        try:
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            wall = time.perf_counter() - t0
        finally:
            hook.remove()
        gen = [int(t) for t in out[0, len(prompt_ids) :].tolist()]
        finish = "length"
        eos_set = set(eos) if not params.ignore_eos else set()
        for i, t in enumerate(gen):  # cut at the first EOS, as our engine stops there
            if t in eos_set:
                gen, finish = gen[: i + 1], "eos"
                break
        committed = len(gen)
        if finish == "eos":
            gen = gen[:-1]
        accepts = _accepts(self._starts, len(prompt_ids), committed)
        return TurnOutput(
            gen, self.tokenizer.decode(gen), accepts, wall, len(prompt_ids), finish
        )


def _accepts(starts: list[int], prompt_len: int, committed: int) -> list[int]:
    """Per-step accept lengths from the cache lengths before each forward.

    ``starts[0]`` is the prefill; decode forward k starts at ``starts[k]`` = committed
    tokens - 1, so it committed ``starts[k + 1] - starts[k]``; the last one ends at the
    output's end (``prompt_len + committed - 1`` cached after it).
    """
    if len(starts) < 2 or committed <= 1:
        return []
    steps = [b - a for a, b in itertools.pairwise(starts[1:])]
    steps.append(prompt_len + committed - 1 - starts[-1])
    # Tokens generated past an EOS / the length cap inside the last step are not committed.
    out, total = [], 0
    for s in steps:
        s = min(s, committed - 1 - total)
        if s <= 0:
            break
        out.append(s)
        total += s
    return out


# ---- construction ------------------------------------------------------------------


class MethodFactory:
    """Builds methods for one engine; peers get a child process each (a native
    ``llama-server`` for ``llamacpp-*``, ``bench/peer_worker.py`` for ``hf-*``)."""

    def __init__(self, engine: Any, model_spec: str | None, dtype: str = "float32") -> None:
        self.engine = engine
        self.model_spec = model_spec
        self.dtype = dtype

    def create(self, name: str) -> Method:
        threads = int(getattr(self.engine, "threads", 0) or _torch_threads())
        if name in LLAMACPP_METHODS:
            from recallspec.bench.hf import gguf_path_for
            from recallspec.bench.llamacpp import ServerConfig
            from recallspec.bench.peers import ServerMethod

            spec = name.removeprefix("llamacpp-")
            cfg = ServerConfig(gguf_path_for(self.model_spec), threads,
                               spec_type=None if spec == "greedy" else spec)
            return ServerMethod(name, cfg, self.engine.tokenizer, baseline_of(name))
        if name in HF_METHODS:
            from recallspec.bench.peers import ChildMethod, peer_command

            cmd = peer_command(name, self.model_spec, threads, self.dtype)
            return ChildMethod(name, cmd, self.engine.tokenizer, baseline_of(name))
        return EngineMethod(self.engine, name)


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())
