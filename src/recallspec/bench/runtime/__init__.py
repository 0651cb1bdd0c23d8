"""``recallspec bench runtime``: our forward against transformers and native llama.cpp."""
