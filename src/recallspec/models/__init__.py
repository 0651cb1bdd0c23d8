"""Model loading (GGUF / HF directories), our transformer implementation and the tokenizer."""

from recallspec.models.config import ModelConfig
from recallspec.models.loader import (
    cache_dir,
    default_model_path,
    gemma3_path,
    load_model,
    load_tokenizer,
    resolve_model,
)
from recallspec.models.tokenizer import Tokenizer
from recallspec.models.transformer import CausalLM

__all__ = [
    "CausalLM",
    "ModelConfig",
    "Tokenizer",
    "cache_dir",
    "default_model_path",
    "gemma3_path",
    "load_model",
    "load_tokenizer",
    "resolve_model",
]
