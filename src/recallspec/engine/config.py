"""The engine's configuration: one frozen dataclass, validated when it is built.

Each parameter is checked here, once, against its one definition, and keeps its one
default: the weight and KV-cache formats and ``max_draft_nodes`` (``params.py``), the
default drafter (a ``DrafterSpec``, parsed here from its text: ``drafters/spec.py``) and
the default mode. The engine and the layers below receive the validated values (the
loader resolves the format names to torch dtypes).

Mode words (``parse_sizing``; requests, the server and ``--mode`` take the same): a draft
sizing, ``adaptive`` or ``fixed``. The engine has one batch layout, EMS-SD's unpadded
one; a layout word (ems, vanilla, unpad-kv, unpad-input) is refused with a message that
names where EMS-SD's padded layouts live (``bench/suite/padded_layouts.py``, a benchmark
ablation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from recallspec.drafters.spec import NO_DRAFTER, DrafterSpec
from recallspec.errors import UnknownNameError
from recallspec.params import (
    DEFAULT_KV_DTYPE,
    DEFAULT_WEIGHT_FORMAT,
    KV_DTYPES,
    MAX_DRAFT_NODES,
    SIZINGS,
    WEIGHT_FORMATS,
    KVDtype,
    Sizing,
    WeightFormat,
    one_of,
    sizing_refusal,
)
from recallspec.recall.service import RecallConfig

_SIZING_MODES: dict[str, Sizing] = {s: s for s in SIZINGS}


def parse_sizing(mode: str) -> Sizing:
    """A mode word as the sizing it names; ``UnknownNameError`` for anything else (see
    the module docstring)."""
    sizing = _SIZING_MODES.get(mode) if isinstance(mode, str) else None
    if sizing is None:
        raise UnknownNameError(sizing_refusal(str(mode), "mode"))
    return sizing


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # path, alias, or None for the default model
    dtype: WeightFormat = DEFAULT_WEIGHT_FORMAT  # one of WEIGHT_FORMATS
    kv_dtype: KVDtype = DEFAULT_KV_DTYPE  # one of KV_DTYPES
    # Save a GGUF's repacked quantized weights in the cache at its first load (a file
    # somewhat larger than the GGUF, read by later loads); False: repack in memory at
    # each load.
    repack_cache: bool = True
    max_batch_size: int = 1  # sequences decoded together (KV-cache slots)
    max_len: int | None = None  # KV positions per sequence; default min(context, 4096)
    prefill_chunk: int = 512  # prompt tokens per step (ride in the decoding forward)
    max_draft_nodes: int = MAX_DRAFT_NODES  # cap on draft-tree nodes per sequence and step
    threads: int | None = None  # cores for decoding; default torch.get_num_threads()
    # Prefix reuse (``engine/prefix_cache.py``): a request starts from the KV a finished
    # request of its tenant left in a free slot for the longest prefix of its prompt;
    # a slot's rows about to be overwritten are copied to a pool of at most
    # ``prefix_cache_tokens`` tokens first (``engine/prefix_pool.py``; 0: slots only;
    # None: 16,384 tokens or 2 GiB of keys and values, whichever is fewer,
    # ``default_pool_tokens``).
    prefix_cache: bool = True
    prefix_cache_tokens: int | None = None
    # KV memory is taken as rows are written (``runtime/kv_memory.py``); admission keeps
    # the rows every slot may hold within this many (``engine/scheduler.py``). None: as
    # many as 80% of the memory available when the engine starts holds, at most every
    # slot full (``KVCache.budget_rows``).
    kv_budget_tokens: int | None = None
    # Requests that name no drafter get this one: a spec as the command line takes it
    # ("name" or "name:key=value:...", parsed here into ``default_drafter``) or a
    # ``DrafterSpec``. The library's default is plain decoding (the exact reference, no
    # cost curve to measure); the command line, the server and the demo default to the
    # measured policy (``recallspec/policy.py``).
    drafter: str | DrafterSpec = NO_DRAFTER
    # Requests that state no mode get this one (a sizing word, kept parsed in
    # ``default_sizing``). None: each request's sizing is what its drafter spec states,
    # else DEFAULT_SIZING (cost-aware: ``engine/drafter_pool.py``).
    mode: str | None = None
    # Response memory (``recall/memory/``): finished requests' outputs (and, with
    # ``memory_prompts``, their prompts) become drafts for later requests of the same
    # tenant. Without ``memory_prompts`` an output is kept behind the last
    # ``memory_prompt_tail`` tokens of its prompt: a request whose prompt ends the same
    # way (the same question asked again, in a fresh conversation) matches there and
    # drafts the earlier answer from its first token, at a few tokens per answer.
    # ``memory_tokens`` is each tenant's token budget (0: off for the engine);
    # a tenant's memory is a ring of at most ``memory_segments`` + 1 automata (more
    # segments: smaller background rebuilds, O(memory_tokens / memory_segments) per
    # finished request, but one more cursor per running request each); beyond
    # ``memory_max_tenants`` tenants the least recently fed one is forgotten.
    memory_tokens: int = 0
    memory_prompts: bool = False
    memory_prompt_tail: int = 32
    memory_segments: int = 4
    memory_max_tenants: int = 64
    # A snapshot file (``Engine.save_memory``) loaded at start when it exists.
    memory_snapshot: str | None = None
    # Derived from ``drafter`` and ``mode`` when the config is built: what the engine reads.
    default_drafter: DrafterSpec = field(init=False, repr=False, compare=False)
    default_sizing: Sizing | None = field(init=False, repr=False, compare=False)
    # Derived from the memory_* fields (and validated there): what the recall service reads.
    recall: RecallConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        one_of("dtype", self.dtype, WEIGHT_FORMATS)
        one_of("kv_dtype", self.kv_dtype, KV_DTYPES)
        if not isinstance(self.repack_cache, bool):
            raise ValueError(f"repack_cache must be True or False, got {self.repack_cache!r}")
        if self.prefix_cache_tokens is not None and self.prefix_cache_tokens < 0:
            raise ValueError("prefix_cache_tokens must be >= 0 (0: slots only)")
        if self.max_batch_size < 1 or self.prefill_chunk < 1 or self.max_draft_nodes < 0:
            raise ValueError("max_batch_size and prefill_chunk must be >= 1, max_draft_nodes >= 0")
        if self.max_len is not None and self.max_len < 2:
            raise ValueError("max_len must be >= 2")
        if self.kv_budget_tokens is not None and self.kv_budget_tokens < 1:
            raise ValueError("kv_budget_tokens must be >= 1")
        object.__setattr__(self, "recall", RecallConfig(
            memory_tokens=self.memory_tokens, memory_prompts=self.memory_prompts,
            memory_prompt_tail=self.memory_prompt_tail, memory_segments=self.memory_segments,
            memory_max_tenants=self.memory_max_tenants, memory_snapshot=self.memory_snapshot))
        spec = (self.drafter if isinstance(self.drafter, DrafterSpec)
                else DrafterSpec.parse(self.drafter))
        object.__setattr__(self, "default_drafter", spec)
        object.__setattr__(self, "default_sizing",
                           None if self.mode is None else parse_sizing(self.mode))
