"""``recallspec bench serve``: OpenAI-compatible servers under Poisson load."""
