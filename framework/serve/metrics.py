"""``GET /metrics``: the engines' counters in Prometheus' text exposition format, labelled
by model.

``prometheus_client`` writes the text (escaping, number format, the exposition rules), so
this module only says what is measured. The counters live where they are counted (the
engine's :class:`~ortgen.serve.engine_stats.EngineStats`, the pool's loads, :class:`HttpStats`);
:class:`ServerCollector` reads them at scrape time rather than mirroring each count into a
``prometheus_client`` object, so the engine thread never waits on a metrics lock and a
model's series outlive its unloads (its stats do). Each app has its own
:class:`~prometheus_client.CollectorRegistry` (:func:`registry`): the process-wide default
one would refuse a second app's series (several apps run in one test process).

Time to first token is exposed twice: ``ortgen_time_to_first_token_seconds``, the summary
dashboards already read (quantiles over each engine's window of recent rows, ``_sum`` and
``_count`` cumulative over every row, as Prometheus expects), and
``ortgen_time_to_first_token_histogram_seconds``, a histogram over every row
(``engine_stats.FIRST_TOKEN_BUCKETS``), which unlike the window's quantiles can be aggregated
over time, models and servers with ``histogram_quantile``. One name cannot carry both:
a histogram has no ``quantile`` series.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .engine_stats import FIRST_TOKEN_BUCKETS

if TYPE_CHECKING:
    from .model_pool import ModelPool

QUANTILES = (0.5, 0.9, 0.99)
#: the Content-Type of :func:`render`'s text (Prometheus' text format 0.0.4)
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


@dataclass
class HttpStats:
    """What the HTTP layer counts itself (the engine counts rows, not requests)."""

    #: (route, status code) -> responses
    responses: dict[tuple[str, int], int] = field(default_factory=dict)
    in_flight: int = 0  # generation requests being answered

    def count(self, route: str, status: int) -> None:
        key = (route, status)
        self.responses[key] = self.responses.get(key, 0) + 1


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile of sorted ``values`` (NaN when there are none)."""
    if not values:
        return float("nan")
    rank = min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))
    return values[rank]


def _recent(window: Iterable[float]) -> list[float]:
    """A sorted copy of the engine's window; the engine thread may append meanwhile."""
    for _ in range(5):
        try:
            return sorted(window)
        except RuntimeError:  # deque mutated during iteration: try again
            continue
    return []


class ServerCollector(Collector):
    """Every series of ``/metrics``, read from the server's counters at each scrape: HTTP
    counts for the server, the rest labelled by model (every served model, loaded or
    not: a series does not vanish with an unload, and its counters go on growing when
    the model is loaded again)."""

    def __init__(self, models: ModelPool, http: HttpStats) -> None:
        self.models = models
        self.http = http

    def collect(self) -> Iterator[Metric]:
        ids = list(self.models.sources)
        yield from self._pool(ids)
        yield from self._http()
        yield from self._engines(ids)
        yield from self._first_token(ids)

    def _pool(self, ids: list[str]) -> Iterator[Metric]:
        info = GaugeMetricFamily("ortgen_info", "The served models (always 1).", labels=["model"])
        loaded = GaugeMetricFamily(
            "ortgen_model_loaded", "1 while the model is loaded, else 0.", labels=["model"]
        )
        for i in ids:
            info.add_metric([i], 1)
            loaded.add_metric([i], int(self.models.state_of(i) == "loaded"))
        yield info
        yield loaded
        stats = self.models.stats
        for name, table, help_text in (
            ("ortgen_model_loads_total", stats.loads, "Times the model was loaded."),
            ("ortgen_model_unloads_total", stats.unloads, "Times it was unloaded for room."),
        ):
            family = CounterMetricFamily(name, help_text, labels=["model"])
            for i in ids:
                family.add_metric([i], table[i])
            yield family

    def _http(self) -> Iterator[Metric]:
        responses = CounterMetricFamily(
            "ortgen_http_requests_total",
            "HTTP responses by route and code.",
            labels=["route", "code"],
        )
        for (route, code), value in sorted(self.http.responses.items()):
            responses.add_metric([route, str(code)], value)
        yield responses
        yield GaugeMetricFamily(
            "ortgen_requests_in_flight",
            "Generation requests being answered.",
            value=self.http.in_flight,
        )

    def _engines(self, ids: list[str]) -> Iterator[Metric]:
        stats = self.models.engine_stats
        for name, attribute, kind, help_text in _ENGINE_SERIES:
            make = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = make(name, help_text, labels=["model"])
            for i in ids:
                family.add_metric([i], getattr(stats[i], attribute))
            yield family

    def _first_token(self, ids: list[str]) -> Iterator[Metric]:
        name = "ortgen_time_to_first_token_seconds"
        help_text = "From queuing a row to its first token."
        # prometheus_client's SummaryMetricFamily has no quantile series: built by hand
        summary = Metric(name, help_text, "summary")
        histogram = HistogramMetricFamily(
            "ortgen_time_to_first_token_histogram_seconds",
            help_text + " Every row, in buckets.",
            labels=["model"],
        )
        for i in ids:
            stats = self.models.engine_stats[i]
            recent = _recent(stats.first_token_s)
            for q in QUANTILES:
                summary.add_sample(name, {"model": i, "quantile": str(q)}, quantile(recent, q))
            summary.add_sample(f"{name}_sum", {"model": i}, stats.first_token_sum)
            summary.add_sample(f"{name}_count", {"model": i}, stats.first_token_count)
            counts = list(stats.first_token_buckets)  # one snapshot: +Inf is their total
            cumulative, buckets = 0, []
            for bound, count in zip(FIRST_TOKEN_BUCKETS, counts, strict=True):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            histogram.add_metric([i], buckets, sum_value=stats.first_token_sum)
        yield summary
        yield histogram


def registry(models: ModelPool, http: HttpStats) -> CollectorRegistry:
    """One app's registry, holding its :class:`ServerCollector` only."""
    own = CollectorRegistry()
    own.register(ServerCollector(models, http))
    return own


def render(own: CollectorRegistry) -> bytes:
    """The exposition text of one scrape (sent with :data:`CONTENT_TYPE`)."""
    return generate_latest(own)


#: (series, EngineStats attribute, kind, help) of each engine's counters and gauges
_ENGINE_SERIES = (
    ("ortgen_rows_total", "requests", "counter", "Rows (one choice of one prompt) queued."),
    ("ortgen_rows_finished_total", "finished", "counter", "Rows that ran to their end."),
    ("ortgen_rows_failed_total", "failed", "counter", "Rows a plugin or the model failed."),
    ("ortgen_rows_cancelled_total", "cancelled", "counter", "Rows cancelled (client gone, drain)."),
    ("ortgen_prompt_tokens_total", "prompt_tokens", "counter", "Prompt tokens of ended rows."),
    ("ortgen_generated_tokens_total", "generated_tokens", "counter", "Tokens generated."),
    (
        "ortgen_shared_prefills_total",
        "shared_prefills",
        "counter",
        "Rows that took a held row's prefill of the same prompt instead of their own.",
    ),
    (
        "ortgen_reused_prompt_tokens_total",
        "reused_prompt_tokens",
        "counter",
        "Prompt tokens taken from a prefix a slot held (a shared system prompt) "
        "instead of prefilled.",
    ),
    (
        "ortgen_drafted_tokens_total",
        "drafted_tokens",
        "counter",
        "Tokens drafters proposed (speculative decoding: prompt_lookup_num_tokens, drafter).",
    ),
    (
        "ortgen_accepted_drafts_total",
        "accepted_drafts",
        "counter",
        "Drafted tokens the model kept; each one saved a forward.",
    ),
    ("ortgen_queue_length", "queue_length", "gauge", "Rows waiting for a batch slot."),
    ("ortgen_batch_size", "batch_size", "gauge", "Rows in the batch being decoded."),
    ("ortgen_peak_batch_size", "peak_batch_size", "gauge", "Most rows one decode step has run."),
    ("ortgen_decode_tokens_per_second", "decode_tokens_per_s", "gauge", "Recent decode speed."),
)
