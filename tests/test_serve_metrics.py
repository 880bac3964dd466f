"""``GET /metrics`` through ``prometheus_client``: the series dashboards read keep their
names, types and labels; the text parses as Prometheus' format; the time-to-first-token
histogram counts every row in its bucket; counters move after a request; two apps in one
process keep apart."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

import ortgen
from ortgen.serve.app import build_app
from ortgen.serve.engine import Engine
from ortgen.serve.engine_stats import FIRST_TOKEN_BUCKETS
from ortgen.serve.metrics import HttpStats, registry, render
from ortgen.serve.model_pool import ModelPool, ModelSource, ServedModel
from ortgen.serve.state import ServerState

#: every family before prometheus_client wrote them (the hand-written text), with its
#: type and its series' label names, plus the histogram added with it
FAMILIES = {
    ("ortgen_info", "gauge"): {"ortgen_info": ("model",)},
    ("ortgen_model_loaded", "gauge"): {"ortgen_model_loaded": ("model",)},
    ("ortgen_model_loads", "counter"): {"ortgen_model_loads_total": ("model",)},
    ("ortgen_model_unloads", "counter"): {"ortgen_model_unloads_total": ("model",)},
    ("ortgen_http_requests", "counter"): {"ortgen_http_requests_total": ("code", "route")},
    ("ortgen_requests_in_flight", "gauge"): {"ortgen_requests_in_flight": ()},
    **{
        (name, "counter"): {f"{name}_total": ("model",)}
        for name in (
            "ortgen_rows",
            "ortgen_rows_finished",
            "ortgen_rows_failed",
            "ortgen_rows_cancelled",
            "ortgen_prompt_tokens",
            "ortgen_generated_tokens",
            "ortgen_shared_prefills",
            "ortgen_reused_prompt_tokens",
            "ortgen_drafted_tokens",
            "ortgen_accepted_drafts",
        )
    },
    **{
        (name, "gauge"): {name: ("model",)}
        for name in (
            "ortgen_queue_length",
            "ortgen_batch_size",
            "ortgen_peak_batch_size",
            "ortgen_decode_tokens_per_second",
        )
    },
    ("ortgen_time_to_first_token_seconds", "summary"): {
        "ortgen_time_to_first_token_seconds": ("model", "quantile"),
        "ortgen_time_to_first_token_seconds_sum": ("model",),
        "ortgen_time_to_first_token_seconds_count": ("model",),
    },
    ("ortgen_time_to_first_token_histogram_seconds", "histogram"): {
        "ortgen_time_to_first_token_histogram_seconds_bucket": ("le", "model"),
        "ortgen_time_to_first_token_histogram_seconds_sum": ("model",),
        "ortgen_time_to_first_token_histogram_seconds_count": ("model",),
    },
}
ODD = 'odd "model"\\ \n id'  # a model id is a folder name: any text, escaped in labels


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    """(series, labels) -> value of an exposition text, parsed by prometheus_client."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_every_series_keeps_its_name_type_and_labels() -> None:
    """A pool of two models, neither loaded (no model needed): each family exactly as
    before, every model's series present, label values escaped and read back."""
    pool = ModelPool([ModelSource("a", Path("/a")), ModelSource(ODD, Path("/b"))], None)
    http = HttpStats()
    http.count("/health", 200)
    pool.engine_stats["a"].requests = 7
    text = render(registry(pool, http)).decode()

    families = {}
    for family in text_string_to_metric_families(text):
        series: dict[str, set] = {}
        for sample in family.samples:
            series.setdefault(sample.name, set()).add(tuple(sorted(sample.labels)))
        assert all(len(labels) == 1 for labels in series.values()), family.name
        families[family.name, family.type] = {name: min(sets) for name, sets in series.items()}
    assert families == FAMILIES

    samples = _samples(text)
    assert _value(samples, "ortgen_rows_total", model="a") == 7
    assert _value(samples, "ortgen_rows_total", model=ODD) == 0
    assert _value(samples, "ortgen_info", model=ODD) == 1
    assert _value(samples, "ortgen_model_loaded", model="a") == 0
    assert _value(samples, "ortgen_http_requests_total", route="/health", code="200") == 1


def test_first_token_histogram_counts_every_row_in_its_bucket() -> None:
    """Buckets are cumulative and ``le`` inclusive; +Inf, ``_count`` and the summary's
    ``_count`` agree, and rows past the summary's window stay counted."""
    pool = ModelPool([ModelSource("m", Path("/m"))], None)
    stats = pool.engine_stats["m"]
    times = [0.01, 0.05, 0.07, 0.3, 59.0, 100.0] + [0.2] * 600  # 606 rows, window 512
    for seconds in times:
        stats.count_first_token(seconds)
    samples = _samples(render(registry(pool, HttpStats())).decode())

    name = "ortgen_time_to_first_token_histogram_seconds"
    want = {"0.05": 2, "0.1": 3, "0.25": 603, "0.5": 604, "45.0": 604, "60.0": 605, "+Inf": 606}
    for le, count in want.items():
        assert _value(samples, f"{name}_bucket", model="m", le=le) == count, le
    buckets = [_le(bound) for bound in FIRST_TOKEN_BUCKETS]
    counts = [_value(samples, f"{name}_bucket", model="m", le=le) for le in buckets]
    assert counts == sorted(counts)  # cumulative
    assert _value(samples, f"{name}_count", model="m") == len(times)
    assert _value(samples, f"{name}_sum", model="m") == pytest.approx(sum(times))
    summary = "ortgen_time_to_first_token_seconds"
    assert _value(samples, f"{summary}_count", model="m") == len(times)
    assert _value(samples, summary, model="m", quantile="0.5") == 0.2  # the window's


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


@pytest.fixture(scope="module")
def tiny_gen(tiny_text_model: Path):
    return ortgen.load(tiny_text_model, threads=1)


def test_counters_move_after_a_request_and_apps_keep_apart(tiny_gen) -> None:
    """Two apps in one process, each with its own registry (the process-wide one would
    refuse the second app's series): a completion on the first moves its counters, by
    what the response reports, and leaves the second's alone."""
    engine = Engine(tiny_gen, max_batch=2)
    served = ServerState(ModelPool.single(ServedModel("tiny", tiny_gen, engine)))
    idle = ServerState(ModelPool([ModelSource("other", Path("/other"))], None))
    with TestClient(build_app(served)) as client, TestClient(build_app(idle)) as other:
        answer = client.get("/metrics")
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        before = _samples(answer.text)
        idle_before = _samples(other.get("/metrics").text)

        body = {"prompt": "hello there", "max_tokens": 5, "temperature": 0}
        response = client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]

        after = _samples(client.get("/metrics").text)  # counted before the answer left
        idle_after = _samples(other.get("/metrics").text)

    def moved(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert moved("ortgen_rows_total", model="tiny") == 1
    assert moved("ortgen_rows_finished_total", model="tiny") == 1
    assert moved("ortgen_prompt_tokens_total", model="tiny") == usage["prompt_tokens"]
    assert moved("ortgen_generated_tokens_total", model="tiny") == usage["completion_tokens"]
    assert moved("ortgen_time_to_first_token_seconds_count", model="tiny") == 1
    histogram = "ortgen_time_to_first_token_histogram_seconds"
    assert moved(f"{histogram}_count", model="tiny") == 1
    assert moved(f"{histogram}_bucket", model="tiny", le="+Inf") == 1
    assert moved(f"{histogram}_sum", model="tiny") > 0
    assert _value(after, "ortgen_http_requests_total", route="/v1/completions", code="200") == 1
    assert _value(after, "ortgen_http_requests_total", route="/metrics", code="200") >= 1
    assert _value(after, "ortgen_requests_in_flight") == 0

    assert not any(dict(labels).get("model") == "tiny" for _, labels in idle_after)
    assert _value(idle_after, "ortgen_rows_total", model="other") == 0
    with pytest.raises(KeyError):
        _value(idle_after, "ortgen_http_requests_total", route="/v1/completions", code="200")
    assert _value(idle_after, "ortgen_http_requests_total", route="/metrics", code="200") == 1
    assert set(idle_before) <= set(idle_after)
