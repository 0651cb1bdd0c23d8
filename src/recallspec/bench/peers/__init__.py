"""The peer methods in child processes: native llama-server (``llamacpp-*``) and the
Python peers' worker (``hf-*``, ``llamacpp-py-*``)."""
