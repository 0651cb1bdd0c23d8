"""Our drafters inside the engines users already run.

* ``recallspec.integrations.hf`` - ``generate``, a ``custom_generate`` callable for
  transformers: tree verification of any drafter on any causal LM, batch >= 1.
* ``recallspec.integrations.vllm`` - ``SuffixProposer``, a vLLM ``custom_class``
  speculative proposer drafting from each request's own text (and a corpus index).
* ``recallspec.integrations.sglang`` - an index's corpus as SGLang's NGRAM external
  corpus (``recallspec index export --format sglang``).

Nothing here imports our engine, and importing this package imports neither
transformers nor vLLM: each submodule imports its host library lazily or for types only.
"""
