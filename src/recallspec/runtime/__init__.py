"""Runtime primitives: ragged batch metadata, the per-sequence KV cache and attention masks."""

from recallspec.runtime.batch import BatchMetadata, SequenceInput, build_batch
from recallspec.runtime.kv_cache import KVCache, KVCacheFullError

__all__ = ["BatchMetadata", "KVCache", "KVCacheFullError", "SequenceInput", "build_batch"]
