"""The engine's configuration: one frozen dataclass, validated when it is built."""

from __future__ import annotations

from dataclasses import dataclass

# Weight formats ``models.loader.load_model`` accepts (the loader resolves them):
# "auto" (quantized for a GGUF, float32 for an HF directory), "quantized", "float32"
# (the token-identical reference) and "bfloat16".
DTYPES = ("auto", "quantized", "float32", "bfloat16")
# KV-cache formats: "auto" (KV_AUTO for the native forward of quantized weights, the
# model's dtype otherwise), "float32", "float16".
KV_DTYPES = ("auto", "float32", "float16")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # path, alias, or None for the default model
    dtype: str = "auto"  # one of DTYPES, passed to the loader as is
    kv_dtype: str = "auto"  # one of KV_DTYPES, passed to the loader as is
    max_batch_size: int = 1  # sequences decoded together (KV-cache slots)
    max_len: int | None = None  # KV positions per sequence; default min(context, 4096)
    prefill_chunk: int = 512  # prompt tokens per step (ride in the decoding forward)
    max_draft_nodes: int = 16  # cap on draft-tree nodes per sequence and step
    threads: int | None = None  # cores for decoding; default torch.get_num_threads()
    # Requests that name no drafter or mode get these: a drafter spec as the CLI takes
    # it ("name" or "name:key=value:..."), and a batch mode (``runtime/modes.py``).
    # The library's default is plain decoding (the exact reference, no cost curve to
    # measure); the command line, the server and the demo default to the measured
    # policy (``recallspec/policy.py``).
    drafter: str = "none"
    mode: str = "ems"
    # Response memory (``index/memory.py``): finished requests' outputs (and, with
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

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, "
                             f"got {self.kv_dtype!r}")
        if self.max_batch_size < 1 or self.prefill_chunk < 1 or self.max_draft_nodes < 0:
            raise ValueError("max_batch_size and prefill_chunk must be >= 1, max_draft_nodes >= 0")
        if self.max_len is not None and self.max_len < 2:
            raise ValueError("max_len must be >= 2")
        if (self.memory_tokens < 0 or self.memory_prompt_tail < 0 or self.memory_segments < 1
                or self.memory_max_tenants < 1):
            raise ValueError("memory_tokens and memory_prompt_tail must be >= 0, "
                             "memory_segments and memory_max_tenants >= 1")
        if self.memory_snapshot is not None and not self.memory_tokens:
            raise ValueError("memory_snapshot needs the response memory (memory_tokens > 0)")
