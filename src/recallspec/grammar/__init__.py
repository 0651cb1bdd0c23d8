"""Grammar-constrained generation: guides compiled with llguidance, per-request matchers.

The only package that imports llguidance. ``compile.py``: a ``Guide`` compiled for a
tokenizer (``GuideCache``); ``matcher.py``: a request's state (``GrammarConstraint``, the
``step/sequence.py: Constraint`` the step core talks to).
"""

from recallspec.grammar.compile import CompiledGuide, GuideCache, GuideTokenizer, compile_guide
from recallspec.grammar.matcher import GrammarConstraint, GrammarError

__all__ = ["CompiledGuide", "GrammarConstraint", "GrammarError", "GuideCache",
           "GuideTokenizer", "compile_guide"]
