"""The speculative step core: draft, verify, commit, learn; one code path for every loop.

``core.speculative_step`` is the one implementation of a step. Its callers differ only in
their ``Verifier`` (``core.py``): the engine's native forward (``engine/runner.py``), a
transformers forward (``integrations/hf.py``) and a teacher-forced replay of recorded
answers (``bench/replay/exact.py``). Drafting and draft sizing (fixed or cost-aware) are
``planner.DraftPlanner``'s; what a sequence must expose to both is ``sequence.py``.
"""
