"""Benchmark data and corpora: locating ../shared/data and reading its formats."""
