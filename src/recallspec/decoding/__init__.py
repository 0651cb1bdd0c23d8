"""Decoding primitives: draft trees, sampling parameters, penalties, logprobs and the
verification of a draft tree against the model's logits (pure functions)."""
