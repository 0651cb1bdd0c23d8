"""The engine's configuration: one frozen dataclass, validated when it is built."""

from __future__ import annotations

from dataclasses import dataclass

# Weight formats ``models.loader.load_model`` accepts (the loader resolves them):
# "auto" (quantized for a GGUF, float32 for an HF directory), "quantized", "float32"
# (the token-identical reference) and "bfloat16".
DTYPES = ("auto", "quantized", "float32", "bfloat16")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # path, alias, or None for the default model
    dtype: str = "auto"  # one of DTYPES, passed to the loader as is
    max_batch_size: int = 1  # sequences decoded together (KV-cache slots)
    max_len: int | None = None  # KV positions per sequence; default min(context, 4096)
    prefill_chunk: int = 512  # prompt tokens per step (ride in the decoding forward)
    max_draft_nodes: int = 16  # cap on draft-tree nodes per sequence and step
    threads: int | None = None  # cores for decoding; default torch.get_num_threads()
    # Requests that name no drafter or mode get these: a drafter spec as the CLI takes
    # it ("name" or "name:key=value:..."), and a batch mode (``runtime/modes.py``).
    drafter: str = "none"
    mode: str = "ems"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.max_batch_size < 1 or self.prefill_chunk < 1 or self.max_draft_nodes < 0:
            raise ValueError("max_batch_size and prefill_chunk must be >= 1, max_draft_nodes >= 0")
        if self.max_len is not None and self.max_len < 2:
            raise ValueError("max_len must be >= 2")
