"""Helpers the benchmarks share (see ``bench/__init__.py``): no sub-command of its own."""
