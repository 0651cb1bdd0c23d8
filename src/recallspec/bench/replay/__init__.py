"""``recallspec bench replay``: exact acceptance replay of recorded ``ar`` answers and
the time prediction built on it."""
