"""Rotary position embeddings: frequencies and cos/sin tables for every ``RopeSpec`` type.

The frequencies are computed in transformers' own float32 steps
(``transformers.modeling_rope_utils``: default, linear, llama3, yarn, longrope), so a model
loaded from a Hugging Face directory rotates by exactly the angles transformers uses (the
tests compare the tensors for equality); "freq_factors" divides the default frequencies
by a GGUF's stored factors, as llama.cpp does with its ``rope_freqs`` tensor. The tables
hold cos and sin of ``position * inv_freq`` for the rotated dims (rotate-half layout: the
``rotary_dim / 2`` angles twice), times the attention factor (yarn's and longrope's
scaling of cos and sin; 1 otherwise), as transformers multiplies them.

LongRoPE picks its short or long factors by length. Transformers picks by the longest
position of each forward (so a sequence switches factors mid-generation, its cached keys
keeping the old ones); llama.cpp picks once per context by its size
(``llama_model::get_rope_factors``: long when the context per sequence exceeds the
original one). We pick as llama.cpp: the long factors iff the KV cache a forward writes
holds more positions per sequence than ``original_context``, a property of the cache, so
every row of every batch in that cache rotates the same way whatever the batch, and a
sequence's keys never mix the two sets.
"""

from __future__ import annotations

import math

import torch

from recallspec.models.config import ModelConfig, RopeSpec


def inv_freq(spec: RopeSpec, dim: int, *, long: bool = False) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, float32 [dim // 2]; attention factor) of ``spec`` over
    ``dim`` rotated dims; ``long``: LongRoPE's long factors (ignored by other types)."""
    base = spec.theta
    exps = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim
    t = spec.type
    if t == "longrope":
        factors = spec.long_factor if long else spec.short_factor
        ext = torch.tensor(factors, dtype=torch.float32)
        return 1.0 / (ext * base**exps), _longrope_attention(spec)
    inv = 1.0 / (base**exps)
    if t == "default":
        return inv, 1.0
    if t == "linear":
        assert spec.factor is not None
        return inv / spec.factor, 1.0
    if t == "freq_factors":
        return inv / torch.tensor(spec.freq_factors, dtype=torch.float32), 1.0
    if t == "llama3":
        return _llama3(spec, inv), 1.0
    if t == "yarn":
        return _yarn(spec, dim)
    raise AssertionError(f"RopeSpec admitted type {t!r}")


def _llama3(spec: RopeSpec, inv: torch.Tensor) -> torch.Tensor:
    assert spec.factor is not None and spec.original_context is not None
    assert spec.low_freq_factor is not None and spec.high_freq_factor is not None
    factor, low, high = spec.factor, spec.low_freq_factor, spec.high_freq_factor
    old = spec.original_context
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(spec: RopeSpec, dim: int) -> tuple[torch.Tensor, float]:
    assert spec.factor is not None and spec.original_context is not None
    base, factor = spec.theta, spec.factor
    attention = spec.attention_factor
    if attention is None:
        if spec.mscale and spec.mscale_all_dim:
            attention = _mscale(factor, spec.mscale) / _mscale(factor, spec.mscale_all_dim)
        else:
            attention = _mscale(factor)
    fast, slow = spec.beta_fast or 32, spec.beta_slow or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(spec.original_context / (rotations * 2 * math.pi))  # type: ignore[operator]
                / (2 * math.log(base)))

    lo, hi = correction_dim(fast), correction_dim(slow)
    if spec.truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv, float(attention)


def _longrope_attention(spec: RopeSpec) -> float:
    if spec.attention_factor is not None:
        return spec.attention_factor
    assert spec.factor is not None and spec.original_context is not None
    if spec.factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(spec.factor) / math.log(spec.original_context))


class RopeTables:
    """The cos/sin tables of one model's layers: one per distinct ``RopeSpec`` (and, for
    LongRoPE, factor set), float32 [N, rotary dims] for positions < N, grown by doubling
    (then cast to the model's dtype). ``kind(layer)`` is a layer's table index, -1 for a
    layer without RoPE; ``for_cache(needed, cache_len)`` the tables of every index."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32) -> None:
        self.dim = config.rotary_dims
        self.dtype = dtype
        specs: list[RopeSpec] = []
        kinds: list[int] = []
        for layer in range(config.num_layers):
            spec = config.layer_rope(layer)
            if spec is None:
                kinds.append(-1)
                continue
            if spec not in specs:
                specs.append(spec)
            kinds.append(specs.index(spec))
        if not specs:  # (every layer NoPE: keep one table, so the native call has one)
            specs.append(config.rope)
        self.specs: tuple[RopeSpec, ...] = tuple(specs)
        self.kinds: tuple[int, ...] = tuple(kinds)
        self._tables: dict[tuple[int, bool], tuple[torch.Tensor, torch.Tensor]] = {}

    def kind(self, layer: int) -> int:
        return self.kinds[layer]

    @staticmethod
    def long_factors(spec: RopeSpec, cache_len: int) -> bool:
        """Whether LongRoPE's long factors apply in a cache of ``cache_len`` positions per
        sequence (module docstring)."""
        return (spec.type == "longrope" and spec.original_context is not None
                and cache_len > spec.original_context)

    def table(self, kind: int, needed: int, cache_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        spec = self.specs[kind]
        key = (kind, self.long_factors(spec, cache_len))
        tab = self._tables.get(key)
        if tab is not None and tab[0].shape[0] >= needed:
            return tab
        n = 1 << max(10, (needed - 1).bit_length())
        inv, attention = inv_freq(spec, self.dim, long=key[1])
        freqs = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        tab = ((emb.cos() * attention).to(self.dtype), (emb.sin() * attention).to(self.dtype))
        self._tables[key] = tab
        return tab

    def for_cache(self, needed: int, cache_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [self.table(k, needed, cache_len) for k in range(len(self.specs))]
