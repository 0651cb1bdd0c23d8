"""Suffix-automaton indexes (SAM-Decoding): a static corpus index persisted in one
memory-mapped file, a dynamic per-request automaton, and a match cursor with chain
and tree drafts. The algorithms live in the C++ core (``recallspec._core``).

Example::

    idx = StaticIndex.build(docs, tok.vocab_size, tok.fingerprint, "corpus.idx")
    idx = StaticIndex.open("corpus.idx", expected_fingerprint=tok.fingerprint)
    cur = idx.cursor()                 # MatchCursor
    cur.advance(prompt_ids)            # one call for many tokens
    chain = cur.draft_chain(40)        # int64 tokens after the earliest occurrence
    tree = cur.draft_tree(32)          # DraftTree, best-first by occurrence count

    req = DynamicAutomaton(prompt_ids) # the request's own text
    req.extend(accepted_ids)           # match_length: longest suffix seen *earlier*
    req.draft_chain(8)
"""

from recallspec.recall.automata.cursor import MatchCursor
from recallspec.recall.automata.dynamic import DynamicAutomaton
from recallspec.recall.automata.static import IndexBuilder, IndexInfo, StaticIndex

__all__ = ["DynamicAutomaton", "IndexBuilder", "IndexInfo", "MatchCursor", "StaticIndex"]
