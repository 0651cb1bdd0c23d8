"""``recallspec bench scale``: ours and native llama.cpp at published model shapes."""
