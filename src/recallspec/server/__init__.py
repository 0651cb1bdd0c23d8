"""An OpenAI-compatible server over the engine (``recallspec serve``).

``engine_loop``: the engine's own thread and the queues to it; ``protocol``: request
validation; ``responses``: response shapes; ``app``: the FastAPI routes; ``corpora``: the live
corpus routes (``/v1/corpora``); ``errors``: error bodies and body parsing;
``metrics``: Prometheus.
"""

from recallspec.server.app import create_app
from recallspec.server.engine_loop import EngineLoop
from recallspec.server.metrics import Metrics

__all__ = ["EngineLoop", "Metrics", "create_app"]
