"""One request's match cursors over the recall sources it may see (``recall/view.py``).

The SAM drafters keep, per request, one ``MatchCursor`` per source of the request's
``RecallView`` (its tenant's response memory, the live corpora), advanced on every
committed token like the static index's cursor, so the match lengths are O(1) to read.

Sources come and go while a request runs (a rebuilt memory segment, a corpus added or
removed). ``refresh`` is called after every commit with the current view: it costs an
identity check per group when nothing changed; otherwise cursors of sources still
present are kept, gone ones dropped, and a cursor for a new source starts from the last
WARM_TOKENS tokens of the request's text (one C++ call), so its match length is capped
at WARM_TOKENS plus what is committed after - enough, since the drafters' length
buckets top out at 32 - instead of replaying the whole text.

Invariant after ``refresh``/``advance``: ``cursors`` are exactly the view's sources, in
the view's order (memory newest first, then corpora), each matched against a suffix of
the request's text; ``best`` is the one whose match length less its kind's ``margin``
(the drafter's delta rule for that kind: a corpus must match clearly longer than the
request's own text, the tenant's memory need not) is the largest (the first on ties),
``best_length`` its match length.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import numpy.typing as npt

from recallspec.recall.automata.cursor import MatchCursor
from recallspec.recall.view import RecallSource, RecallView

WARM_TOKENS = 256


class RecallCursors:
    __slots__ = ("_margins", "best", "best_length", "cursors", "view")

    def __init__(self, margins: Mapping[str, int] | None = None) -> None:
        self._margins = dict(margins or {})  # per source kind; absent: 0
        self.view: RecallView = ()
        self.cursors: list[tuple[RecallSource, MatchCursor]] = []
        self.best: tuple[RecallSource, MatchCursor] | None = None
        self.best_length = 0

    def margin(self, kind: str) -> int:
        """What a match of this kind of source must exceed the request's own by."""
        return self._margins.get(kind, 0)

    def refresh(self, view: RecallView, text: Callable[[], npt.NDArray[np.uint32]]) -> None:
        """Follow ``view``; ``text()`` gives the request's text (called only when a new
        source needs a cursor)."""
        if len(view) == len(self.view) and all(
                a is b for a, b in zip(view, self.view, strict=True)):
            return
        old = dict(self.cursors)
        tail: npt.NDArray[np.uint32] | None = None
        cursors = []
        for group in view:
            for src in group:
                cur = old.get(src)
                if cur is None:
                    if tail is None:
                        tail = np.ascontiguousarray(text()[-WARM_TOKENS:], np.uint32)
                    cur = src.index.cursor()
                    cur.advance(tail)
                cursors.append((src, cur))
        self.view, self.cursors = view, cursors
        self._pick()

    def advance(self, tokens: npt.NDArray[np.uint32]) -> None:
        if not self.cursors:  # nothing to follow; ``best`` is already None
            return
        for _, cur in self.cursors:
            cur.advance(tokens)
        self._pick()

    def _pick(self) -> None:
        self.best, self.best_length = None, 0
        score = 0
        margins = self._margins
        for src, cur in self.cursors:
            n = cur.match_length
            if n and (self.best is None or n - margins.get(src.kind, 0) > score):
                self.best, self.best_length = (src, cur), n
                score = n - margins.get(src.kind, 0)
