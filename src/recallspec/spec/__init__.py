"""Speculative decoding primitives: draft trees, sampling parameters and verification."""
