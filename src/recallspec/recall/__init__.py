"""Everything a draft is recalled from besides the request's own tokens, its file
formats and readers, and the one service the engine owns over the run-time sources.

Layout (each module's docstring states its contract):

* ``automata/`` - suffix automata (the C++ core's Python side): ``StaticIndex`` (a
  corpus index in one mmapped file), ``DynamicAutomaton`` (one request's own text),
  ``MatchCursor``.
* ``view.py`` - ``RecallSource`` (an immutable automaton and its kind) and
  ``RecallView`` (what a request may see), and ``ScratchDir`` for run-time builds.
* ``memory/`` - the per-tenant response memory and its snapshot file.
* ``live_corpora.py`` - corpora added to and removed from a running engine.
* ``worker.py`` - the background build thread of the memory and the corpora.
* ``service.py`` - ``RecallSources``: memory + corpora, what a request sees, what a
  finished request feeds (configured by ``RecallConfig``).
* ``request_cursors.py`` - one request's match cursors over its view (SAM drafters).
* ``datastore/`` - REST (suffix array file) and CREST (n-gram -> tree stores).
* ``fileio.py`` - atomic file writes, shared by the snapshot and the datastores.

Layering: this package imports ``_core``, ``errors``, ``decoding.tree`` and
``data.corpus_files``; never ``drafters``, ``engine``, ``server`` or ``bench``.
"""
