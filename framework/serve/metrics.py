"""``GET /metrics``: the engines' counters in Prometheus' text exposition format, labelled
by model.

Written by hand (a dozen lines of text) rather than with ``prometheus_client``, so serving
needs no further dependency. Counters only grow; gauges are read at scrape time. The
time-to-first-token quantiles come from each engine's window of recent rows
(``EngineStats.first_token_s``); the summary's ``_sum`` and ``_count`` are cumulative
over every row, as Prometheus expects of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .model_pool import ModelPool

QUANTILES = (0.5, 0.9, 0.99)


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


def _value(value: float) -> str:
    return "NaN" if math.isnan(value) else f"{value:.6g}"


def _recent(window: Iterable[float]) -> list[float]:
    """A sorted copy of the engine's window; the engine thread may append meanwhile."""
    for _ in range(5):
        try:
            return sorted(window)
        except RuntimeError:  # deque mutated during iteration: try again
            continue
    return []


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _metric(lines: list[str], name: str, kind: str, help_text: str) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")


def _labels(labels: Mapping[str, object]) -> str:
    """Prometheus' label set; values escaped (a model id is a folder name: any text)."""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{{{inner}}}" if inner else ""


def render(models: ModelPool, http: HttpStats) -> str:
    """The exposition text for one scrape: HTTP counts for the server, the rest labelled
    by model (every served model, loaded or not: a series does not vanish with an
    unload, and its counters go on growing when the model is loaded again)."""
    ids = list(models.sources)
    lines: list[str] = []
    _metric(lines, "ortgen_info", "gauge", "The served models (always 1).")
    lines.extend(f"ortgen_info{_labels({'model': i})} 1" for i in ids)
    _metric(lines, "ortgen_model_loaded", "gauge", "1 while the model is loaded, else 0.")
    lines.extend(
        f"ortgen_model_loaded{_labels({'model': i})} {int(models.state_of(i) == 'loaded')}"
        for i in ids
    )
    for name, table, help_text in (
        ("ortgen_model_loads_total", models.stats.loads, "Times the model was loaded."),
        ("ortgen_model_unloads_total", models.stats.unloads, "Times it was unloaded for room."),
    ):
        _metric(lines, name, "counter", help_text)
        lines.extend(f"{name}{_labels({'model': i})} {table[i]}" for i in ids)

    _metric(lines, "ortgen_http_requests_total", "counter", "HTTP responses by route and code.")
    for (route, code), value in sorted(http.responses.items()):
        lines.append(f"ortgen_http_requests_total{_labels({'route': route, 'code': code})} {value}")
    _metric(lines, "ortgen_requests_in_flight", "gauge", "Generation requests being answered.")
    lines.append(f"ortgen_requests_in_flight {http.in_flight}")

    stats = models.engine_stats
    for name, attribute, kind, help_text in _ENGINE_SERIES:
        _metric(lines, name, kind, help_text)
        for i in ids:
            value = getattr(stats[i], attribute)
            shown = value if kind == "counter" else f"{float(value):g}"
            lines.append(f"{name}{_labels({'model': i})} {shown}")

    name = "ortgen_time_to_first_token_seconds"
    _metric(lines, name, "summary", "From queuing a row to its first token.")
    for i in ids:
        recent = _recent(stats[i].first_token_s)
        for q in QUANTILES:
            estimate = _value(quantile(recent, q))
            lines.append(f"{name}{_labels({'model': i, 'quantile': q})} {estimate}")
        lines.append(f"{name}_sum{_labels({'model': i})} {stats[i].first_token_sum:.6g}")
        lines.append(f"{name}_count{_labels({'model': i})} {stats[i].first_token_count}")
    return "\n".join(lines) + "\n"


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
