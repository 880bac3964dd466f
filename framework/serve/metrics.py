"""``GET /metrics``: the engine's counters in Prometheus' text exposition format.

Written by hand (a dozen lines of text) rather than with ``prometheus_client``, so serving
needs no further dependency. Counters only grow; gauges are read at scrape time. The
time-to-first-token quantiles come from the engine's window of recent rows
(``EngineStats.first_token_s``); the summary's ``_sum`` and ``_count`` are cumulative
over every row, as Prometheus expects of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .engine import EngineStats

QUANTILES = (0.5, 0.9, 0.99)


@dataclass
class HttpStats:
    """What the HTTP layer counts itself (the engine counts rows, not requests)."""

    #: (route, status code) -> responses
    responses: dict[tuple[str, int], int] = field(default_factory=dict)
    in_flight: int = 0  # generation requests being answered
    first_token_sum: float = 0.0  # seconds, over every row that produced a token
    first_token_count: int = 0

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


def _metric(lines: list[str], name: str, kind: str, help_text: str) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")


def _labels(labels: Mapping[str, object]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{{{inner}}}" if inner else ""


def render(stats: EngineStats, http: HttpStats, *, model: str) -> str:
    """The exposition text for one scrape."""
    lines: list[str] = []
    _metric(lines, "ortgen_info", "gauge", "The served model (always 1).")
    lines.append(f"ortgen_info{_labels({'model': model})} 1")

    _metric(lines, "ortgen_http_requests_total", "counter", "HTTP responses by route and code.")
    for (route, code), value in sorted(http.responses.items()):
        lines.append(f"ortgen_http_requests_total{_labels({'route': route, 'code': code})} {value}")
    _metric(lines, "ortgen_requests_in_flight", "gauge", "Generation requests being answered.")
    lines.append(f"ortgen_requests_in_flight {http.in_flight}")

    counters = (
        ("ortgen_rows_total", stats.requests, "Rows (one choice of one prompt) queued."),
        ("ortgen_rows_finished_total", stats.finished, "Rows that ran to their end."),
        ("ortgen_rows_failed_total", stats.failed, "Rows a plugin or the model failed."),
        ("ortgen_rows_cancelled_total", stats.cancelled, "Rows cancelled (client gone, shutdown)."),
        ("ortgen_prompt_tokens_total", stats.prompt_tokens, "Prompt tokens of ended rows."),
        ("ortgen_generated_tokens_total", stats.generated_tokens, "Tokens generated."),
        (
            "ortgen_shared_prefills_total",
            stats.shared_prefills,
            "Rows that took a held row's prefill of the same prompt instead of their own.",
        ),
        (
            "ortgen_reused_prompt_tokens_total",
            stats.reused_prompt_tokens,
            "Prompt tokens taken from a prefix a slot held (a shared system prompt) "
            "instead of prefilled.",
        ),
        (
            "ortgen_drafted_tokens_total",
            stats.drafted_tokens,
            "Tokens drafters proposed (speculative decoding: prompt_lookup_num_tokens, drafter).",
        ),
        (
            "ortgen_accepted_drafts_total",
            stats.accepted_drafts,
            "Drafted tokens the model kept; each one saved a forward.",
        ),
    )
    for name, value, help_text in counters:
        _metric(lines, name, "counter", help_text)
        lines.append(f"{name} {value}")
    gauges = (
        ("ortgen_queue_length", stats.queue_length, "Rows waiting for a batch slot."),
        ("ortgen_batch_size", stats.batch_size, "Rows in the batch being decoded."),
        ("ortgen_peak_batch_size", stats.peak_batch_size, "Most rows one decode step has run."),
        ("ortgen_decode_tokens_per_second", stats.decode_tokens_per_s, "Recent decode speed."),
    )
    for name, gauge, help_text in gauges:
        _metric(lines, name, "gauge", help_text)
        lines.append(f"{name} {float(gauge):g}")

    name = "ortgen_time_to_first_token_seconds"
    _metric(lines, name, "summary", "From queuing a row to its first token.")
    recent = _recent(stats.first_token_s)
    for q in QUANTILES:
        lines.append(f"{name}{_labels({'quantile': q})} {_value(quantile(recent, q))}")
    lines.append(f"{name}_sum {http.first_token_sum:.6g}")
    lines.append(f"{name}_count {http.first_token_count}")
    return "\n".join(lines) + "\n"
