"""``recallspec bench repeat``: repeating workloads with and without response memory."""
