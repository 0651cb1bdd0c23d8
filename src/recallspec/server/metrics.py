"""Prometheus metrics of the server, vLLM's names under our prefix (``recallspec:``), so
existing dashboards work. Updated only by the engine thread, from each step's outputs;
the spec-decode counters advance as requests speculate (not only when they end). The
response memory and the corpora are reported as totals (no label per tenant or corpus:
their number is the clients' to choose, a label each would grow without bound)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from recallspec.engine import RequestOutput, SpecStats
from recallspec.engine.prefix_cache import PrefixCacheStats

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
                    1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


class Metrics:
    def __init__(self, model_name: str) -> None:
        self.registry = r = CollectorRegistry()
        m = ("model_name",)
        self._model = model_name
        self.requests = Counter("recallspec:request_success", "Requests finished, by finish "
                                "reason (abort: the client went away)",
                                (*m, "finished_reason"), registry=r)
        self.rejected = Counter("recallspec:request_rejected", "Requests refused before "
                                "running, by HTTP status", (*m, "status"), registry=r)
        self.prompt_tokens = Counter("recallspec:prompt_tokens", "Prompt tokens of admitted "
                                     "requests", m, registry=r)
        self.generation_tokens = Counter("recallspec:generation_tokens", "Generated tokens",
                                         m, registry=r)
        self.running = Gauge("recallspec:num_requests_running", "Requests holding a KV slot",
                             m, registry=r)
        self.waiting = Gauge("recallspec:num_requests_waiting", "Requests waiting for a slot",
                             m, registry=r)
        self.ttft = Histogram("recallspec:time_to_first_token_seconds", "Request arrival to "
                              "its first token", m, buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("recallspec:inter_token_latency_seconds", "Time between a "
                             "request's consecutive token deltas (one per step)", m,
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("recallspec:e2e_request_latency_seconds", "Request arrival to "
                             "its end", m, buckets=_LATENCY_BUCKETS, registry=r)
        self.drafts = Counter("recallspec:spec_decode_num_drafts", "Steps that verified a "
                              "draft", m, registry=r)
        self.draft_tokens = Counter("recallspec:spec_decode_num_draft_tokens", "Draft tokens "
                                    "verified", m, registry=r)
        self.accepted = Counter("recallspec:spec_decode_num_accepted_tokens", "Draft tokens "
                                "accepted", m, registry=r)
        self.accepted_per_pos = Counter("recallspec:spec_decode_num_accepted_tokens_per_pos",
                                        "Drafts whose accepted path reached this depth "
                                        "(position 0 = the first draft token)",
                                        (*m, "position"), registry=r)
        self.forced = Counter("recallspec:spec_decode_num_forced_tokens", "Accepted draft "
                              "tokens that a grammar forced (among the accepted)", m,
                              registry=r)
        self.cut = Counter("recallspec:spec_decode_num_cut_draft_tokens", "Drafter tokens a "
                           "grammar forbade, cut before verification", m, registry=r)
        self.memory_tokens = Gauge("recallspec:memory_tokens", "Tokens held in the response "
                                   "memory, all tenants together", m, registry=r)
        self.memory_tenants = Gauge("recallspec:memory_tenants", "Tenants holding text in the "
                                    "response memory", m, registry=r)
        self.memory_budget = Gauge("recallspec:memory_budget_tokens", "Response-memory "
                                   "budget per tenant (0: the memory is off)", m, registry=r)
        self.memory_evictions = Counter("recallspec:memory_evictions", "Texts evicted from the "
                                        "response memory to stay within its budget", m,
                                        registry=r)
        self.corpora_count = Gauge("recallspec:corpora", "Corpora registered, by status",
                                   (*m, "status"), registry=r)
        self.corpus_tokens = Gauge("recallspec:corpus_tokens", "Tokens of the ready corpora",
                                   m, registry=r)
        # The prefix cache's counters, by their ``PrefixCacheStats`` field.
        self.prefix_counters = {
            name: Counter(f"recallspec:prefix_cache_{name}", doc, m, registry=r)
            for name, doc in (
                ("queries", "Prompt tokens looked up in the prefix cache"),
                ("hits", "Prompt tokens whose KV was reused from the prefix cache"),
                ("evictions", "Retained prefixes dropped for another request's slot"))}
        self.prefix_resident = Gauge("recallspec:prefix_cache_resident_tokens", "Tokens "
                                     "retained for reuse in free KV slots", m, registry=r)
        self.prefix_budget = Gauge("recallspec:prefix_cache_budget_tokens", "Tokens the "
                                   "prefix pool may hold (--prefix-cache-tokens)", m, registry=r)
        self.kv_resident = Gauge("recallspec:kv_cache_resident_tokens", "KV rows held in "
                                 "memory now: what the slots may hold (running requests', "
                                 "retained prefixes) and the prefix pool's copies", m, registry=r)
        self.pool_resident = Gauge("recallspec:prefix_pool_resident_tokens", "Tokens the "
                                   "prefix pool holds now (copies of evicted slots' rows)", m,
                                   registry=r)
        self.kv_budget = Gauge("recallspec:kv_cache_budget_tokens", "KV rows admission keeps "
                               "the slots within", m, registry=r)
        self._evictions = 0
        self._prefix_seen = PrefixCacheStats(0, 0, 0, 0, 0)

    def queue(self, running: int, waiting: int) -> None:
        self.running.labels(self._model).set(running)
        self.waiting.labels(self._model).set(waiting)

    def reject(self, status: int) -> None:
        self.rejected.labels(self._model, str(status)).inc()

    def admitted(self, prompt_tokens: int) -> None:
        self.prompt_tokens.labels(self._model).inc(prompt_tokens)

    def output(self, out: RequestOutput, last: SpecStats | None, t_submit: float,
               t_prev: float | None, now: float) -> None:
        """One request's delta: its tokens, latencies and speculation since ``last``."""
        m = self._model
        if out.new_token_ids:
            self.generation_tokens.labels(m).inc(len(out.new_token_ids))
        if out.num_committed:
            if t_prev is None:
                self.ttft.labels(m).observe(now - t_submit)
            else:
                self.itl.labels(m).observe(now - t_prev)
        s = out.spec
        prev = last or SpecStats(0, 0, 0, 0, 0, ())
        if s.num_drafts > prev.num_drafts:
            self.drafts.labels(m).inc(s.num_drafts - prev.num_drafts)
            self.draft_tokens.labels(m).inc(s.num_draft_tokens - prev.num_draft_tokens)
            self.accepted.labels(m).inc(s.num_accepted_tokens - prev.num_accepted_tokens)
            for pos, n in enumerate(s.accepted_per_pos):
                before = prev.accepted_per_pos[pos] if pos < len(prev.accepted_per_pos) else 0
                if n > before:
                    self.accepted_per_pos.labels(m, str(pos)).inc(n - before)
        if s.num_forced_tokens > prev.num_forced_tokens:
            self.forced.labels(m).inc(s.num_forced_tokens - prev.num_forced_tokens)
        if s.num_cut_tokens > prev.num_cut_tokens:
            self.cut.labels(m).inc(s.num_cut_tokens - prev.num_cut_tokens)
        if out.finished:
            self.requests.labels(m, out.finish_reason or "unknown").inc()
            self.e2e.labels(m).observe(now - t_submit)

    def memory(self, stats: Mapping[str, Any]) -> None:
        """The response memory's figures (``Engine.memory_stats()``)."""
        m = self._model
        self.memory_tokens.labels(m).set(int(stats.get("tokens", 0)))
        tenants = stats.get("tenants", 0)  # a count, or a mapping tenant -> figures
        self.memory_tenants.labels(m).set(len(tenants) if isinstance(tenants, Mapping)
                                          else int(tenants))
        self.memory_budget.labels(m).set(int(stats.get("budget_tokens", 0)))
        evictions = int(stats.get("evictions", 0))
        if evictions > self._evictions:
            self.memory_evictions.labels(m).inc(evictions - self._evictions)
        self._evictions = max(self._evictions, evictions)

    def prefix_cache(self, stats: PrefixCacheStats | None) -> None:
        """The prefix cache's counters (``Engine.prefix_cache_stats()``; None: off)."""
        if stats is None:
            return
        m, seen = self._model, self._prefix_seen
        for name, counter in self.prefix_counters.items():
            now, before = getattr(stats, name), getattr(seen, name)
            if now > before:
                counter.labels(m).inc(now - before)
        self.prefix_resident.labels(m).set(stats.resident_tokens)
        self._prefix_seen = stats

    def kv_cache(self, resident: int, budget: int, pool: int, prefix_budget: int) -> None:
        """KV rows in memory, the admission budget, the pool's tokens and budget."""
        m = self._model
        self.pool_resident.labels(m).set(pool)
        self.kv_resident.labels(m).set(resident)
        self.kv_budget.labels(m).set(budget)
        self.prefix_budget.labels(m).set(prefix_budget)

    def corpora(self, infos: Iterable[Any]) -> None:
        """The corpora registered (``CorpusInfo``s): how many in each status, and the
        tokens of the ready ones."""
        counts = dict.fromkeys(("loading", "ready", "failed"), 0)
        tokens = 0
        for info in infos:
            counts[info.status] = counts.get(info.status, 0) + 1
            if info.status == "ready":
                tokens += int(info.tokens or 0)
        for status, n in counts.items():
            self.corpora_count.labels(self._model, status).set(n)
        self.corpus_tokens.labels(self._model).set(tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
