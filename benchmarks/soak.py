"""`ortgen serve` soak: mixed traffic for N minutes, then SIGTERM with requests in flight.

Starts ``ortgen serve`` (the default model unless ``--model``; 127.0.0.1, a free port, an
API key from the environment), sends it the largest requests of the mix at once (the
warm-up wave: ``max-batch`` ~500-token prompts, then two with ``n: 2``), then runs
``--clients`` client threads for ``--minutes``. Each picks its next request at random
(seeded by ``--seed``):

* generation (70%): chat or completions, streamed or not, greedy or sampled (temperature,
  top_p, seed; sometimes ``n: 2``), short (4-24) or long (128-256) ``max_tokens``, a
  short or (one in five) a ~500-token prompt;
* a stream the client hangs up after 1-8 events, and a non-streamed request it hangs up
  0.1-1.5 s after sending (a cancellation) (6% each);
* a bad request (14%): malformed JSON, not an object, an unknown field, a wrong type,
  negative ``max_tokens``, wrong ``messages``, a temperature out of range, a body over
  ``--max-body-bytes``, a wrong API key, an unknown route, a wrong method: each must be
  its 4xx with OpenAI's error body (``{"error": {"message", "type", "param", "code"}}``);
* ``/v1/models``, ``/v1/models/ID``, ``/metrics`` (4%).

Besides, every ``--burst-every`` seconds (60, or a third of a shorter run) a burst of
``max-batch + max-queue + 8`` requests at once overflows the queue: the overflow gets
429s, each of which must be clean (OpenAI's body, ``rate_limit_error``; a
``Retry-After`` header is counted); ``/health`` is polled every second; the server's RSS
(``VmRSS`` of ``/proc/PID/status``) is sampled every ``--rss-every`` seconds; a watcher
records when this process itself was not scheduled for over 1 s (the machine stalled).
When the time is up, the clients finish what they have in flight, and the server must
have nothing in flight, queued or decoding (``/metrics``); then ``max-batch`` short
streams and two requests longer than ``--grace`` (one streamed, one not) start, and
SIGTERM is sent once the batch is full: a new request must get a clean 503, the short
streams must finish, the long ones end with a clean error (the stream's error event, a
503 body), and the process must exit 0 within ``--grace`` plus 2 s (the cancellation of
what is left after the grace and the process's own exit).

Goals (the exit status is 1 when one fails): RSS grows <= 5% after warm-up (the first
10% of the run; the median of the first window after it against the median of the last
window, a window being 5% of the run, 10-60 s), no 5xx, every 429 clean (and the bursts
got some), every other answer as expected (successes well formed, bad requests their
4xx), ``/health`` 200 within 5 s throughout (a slow answer while this process itself
stalled is the machine's, and is reported apart), nothing left in flight, the drain as
above. The report: a Markdown table printed, and JSON (``--json``) with the RSS series.

    python benchmarks/soak.py --minutes 20 [--seed 0] [--clients 4] [--max-batch 4]
        [--max-queue 16] [--grace 10] [--json benchmarks/results/soak.json]
    python benchmarks/plot_soak.py   # docs/img/soak.png from the JSON
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import platform
import random
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from serve_load import QUESTIONS, launch
from sweep import write_report

#: a ~500-token prompt (the model's context is 2048; long answers still fit)
LONG_TEXT = (
    "The history of the bicycle spans more than two centuries. Early designs had no "
    "pedals; riders pushed themselves along with their feet. Cranks on the front wheel, "
    "then chains to the rear wheel, pneumatic tyres and gears followed, each making the "
    "machine faster, safer and more comfortable. "
) * 8
COMPLETION_PROMPTS = [
    "Once upon a time",
    "The three most important inventions of the last century are",
    "def fibonacci(n):",
    "Dear hiring manager,",
]
HEALTH_SLOW_S = 5.0  # a /health slower than this counts as a failure
DRAIN_SLACK_S = 2.0  # the cancellation after --grace and the process's own exit
RSS_GOAL = 0.05


@dataclass
class Result:
    """One request's outcome. ``outcome``: ok, rate_limited (a clean 429), refused (a bad
    request's expected 4xx), hung_up (the client left on purpose), unexpected."""

    kind: str
    started: float  # seconds since the soak began
    status: int | None = None
    outcome: str = "unexpected"
    latency: float = 0.0
    ttft: float | None = None
    detail: str = ""
    error_type: str | None = None
    retry_after: str | None = None


@dataclass
class Soak:
    """What the threads share: the server, its URL and key, the clock, the results."""

    url: str
    key: str
    pid: int
    max_body_bytes: int
    t0: float = field(default_factory=time.monotonic)
    results: list[Result] = field(default_factory=list)
    health: list[tuple[float, int | None, float]] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)
    stalls: list[tuple[float, float]] = field(default_factory=list)  # (at, seconds)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    timeout: float = 300.0
    long_text: str = LONG_TEXT

    def now(self) -> float:
        return time.monotonic() - self.t0

    def add(self, result: Result) -> None:
        with self.lock:
            self.results.append(result)

    def connect(self, timeout: float | None = None) -> http.client.HTTPConnection:
        parts = urlsplit(self.url)
        return http.client.HTTPConnection(
            parts.hostname or "127.0.0.1", parts.port, timeout=timeout or self.timeout
        )

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Content-Type": "application/json", "Authorization": f"Bearer {key or self.key}"}


# -- one request -------------------------------------------------------------------------


def _error_body(raw: bytes) -> tuple[bool, str | None, str]:
    """(is OpenAI's error body, its type, a short text of it)."""
    text = raw.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        return False, None, text[:300]
    error = body.get("error") if isinstance(body, dict) else None
    ok = (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and isinstance(error.get("type"), str)
        and {"param", "code"} <= error.keys()
    )
    return ok, error.get("type") if isinstance(error, dict) else None, text[:300]


def _classify_error(result: Result, status: int, raw: bytes, headers: Any) -> Result:
    """A non-200 answer to a request meant to succeed: a clean 429 or unexpected."""
    clean, kind, text = _error_body(raw)
    result.status, result.error_type, result.detail = status, kind, text
    result.retry_after = headers.get("Retry-After") if headers is not None else None
    if status == 429 and clean and kind == "rate_limit_error":
        result.outcome = "rate_limited"
    elif status == 503 and clean and kind == "server_error":
        result.outcome = "shutting_down"  # a failure but while the server drains
    return result


def generate(soak: Soak, kind: str, path: str, body: dict[str, Any], hang_up: int = 0) -> Result:
    """POST one generation request and read its answer (its SSE events when streamed).
    ``hang_up``: close the connection after that many events (non-streamed: after
    ``hang_up`` tenths of a second) instead of reading the answer."""
    result = Result(kind, soak.now())
    started = time.monotonic()
    conn = soak.connect()
    try:
        conn.request("POST", path, json.dumps(body).encode(), soak.headers())
        sock = conn.sock
        if hang_up and not body.get("stream"):
            time.sleep(hang_up / 10)
            _hang_up(conn, sock)
            result.outcome, result.latency = "hung_up", time.monotonic() - started
            return result
        response = conn.getresponse()
        result.status = response.status
        if response.status != 200:
            _classify_error(result, response.status, response.read(), response.headers)
        elif body.get("stream"):
            _read_stream(result, response, started, body, hang_up, lambda: _hang_up(conn, sock))
        else:
            _check_answer(result, response.read(), body)
    except (OSError, http.client.HTTPException) as exc:
        result.outcome, result.detail = "unexpected", f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    result.latency = time.monotonic() - started
    return result


def _hang_up(conn: http.client.HTTPConnection, sock: socket.socket | None) -> None:
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    conn.close()


def _read_stream(
    result: Result,
    response: http.client.HTTPResponse,
    started: float,
    body: dict[str, Any],
    hang_up: int,
    close: Any,
) -> None:
    events = 0
    finish = None
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue  # blank separators, ": ping" comments
        data = line[5:].strip()
        if data == "[DONE]":
            if finish is None:
                result.detail = "[DONE] without a finish_reason"
            else:
                result.outcome = "ok"
            return
        event = json.loads(data)
        if "error" in event:
            clean, kind, text = _error_body(data.encode())
            result.error_type, result.detail = kind, f"error event: {text}"
            result.outcome = "stream_error" if clean else "unexpected"
            return
        events += 1
        for choice in event.get("choices") or []:
            piece = choice.get("text") or (choice.get("delta") or {}).get("content")
            if piece and result.ttft is None:
                result.ttft = time.monotonic() - started
            finish = choice.get("finish_reason") or finish
        if hang_up and events >= hang_up:
            close()
            result.outcome = "hung_up"
            return
    result.detail = f"the stream ended without [DONE] after {events} events"


def _check_answer(result: Result, raw: bytes, body: dict[str, Any]) -> None:
    answer = json.loads(raw)
    choices = answer.get("choices") or []
    rows = body.get("n", 1) * (len(body["prompt"]) if isinstance(body.get("prompt"), list) else 1)
    usage = answer.get("usage") or {}
    if len(choices) != rows:
        result.detail = f"{len(choices)} choices, expected {rows}"
    elif any(c.get("finish_reason") not in ("stop", "length") for c in choices):
        result.detail = f"finish reasons {[c.get('finish_reason') for c in choices]}"
    elif usage.get("completion_tokens", 0) > body["max_tokens"] * rows:
        result.detail = f"usage {usage} over max_tokens {body['max_tokens']}"
    else:
        result.outcome = "ok"


def plain(
    soak: Soak,
    kind: str,
    method: str,
    path: str,
    data: bytes | None,
    expect: int,
    key: str | None = None,
    timeout: float | None = None,
) -> Result:
    """One request answered whole; ``expect`` its status (a 4xx must carry OpenAI's body)."""
    result = Result(kind, soak.now())
    started = time.monotonic()
    conn = soak.connect(timeout)
    try:
        try:
            conn.putrequest(method, path)
            for name, value in soak.headers(key).items():
                conn.putheader(name, value)
            if data is not None:
                conn.putheader("Content-Length", str(len(data)))
            conn.endheaders(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # a refused oversized body: the answer may still be there to read
        response = conn.getresponse()
        raw = response.read()
        result.status = response.status
        if response.status >= 400:
            clean, result.error_type, result.detail = _error_body(raw)
            result.retry_after = response.headers.get("Retry-After")
        else:
            clean = True
        if response.status == 429 and clean and result.error_type == "rate_limit_error":
            result.outcome = "rate_limited"
        elif response.status == expect and clean:
            result.outcome = "refused" if expect >= 400 else "ok"
        elif response.status != expect:
            result.detail = f"expected {expect}, got {response.status}: {result.detail}"
        else:
            result.detail = f"not OpenAI's error body: {result.detail}"
    except (OSError, http.client.HTTPException) as exc:
        result.detail = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    result.latency = time.monotonic() - started
    return result


# -- the traffic mix ---------------------------------------------------------------------


def generation_body(
    rng: random.Random, chat: bool, stream: bool, long: bool, long_text: str = LONG_TEXT
) -> dict[str, Any]:
    """A request meant to succeed: greedy or sampled, short or long prompt."""
    question = rng.choice(QUESTIONS)
    if rng.random() < 0.2:
        question = f"{long_text}\n\nIn one sentence: {question}"
    body: dict[str, Any] = {
        "model": "soak",
        "max_tokens": rng.randint(128, 256) if long else rng.randint(4, 24),
        "stream": stream,
    }
    if chat:
        body["messages"] = [{"role": "user", "content": question}]
    else:
        body["prompt"] = rng.choice([*COMPLETION_PROMPTS, question])
    if rng.random() < 0.5:
        body["temperature"] = 0
    else:
        body["temperature"] = round(rng.uniform(0.5, 1.2), 2)
        body["top_p"] = round(rng.uniform(0.8, 1.0), 2)
        body["seed"] = rng.randrange(1 << 30)
        if not stream and rng.random() < 0.2:
            body["n"] = 2
    if stream and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    return body


def bad_requests(soak: Soak) -> list[tuple[str, str, str, bytes | None, int, str | None]]:
    """(name, method, path, body, expected status, API key) of each bad request."""
    chat = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    def body(**fields: Any) -> bytes:
        return json.dumps({**chat, **fields}).encode()

    big = json.dumps({"model": "x", "prompt": "a" * (soak.max_body_bytes + 1)}).encode()
    completions, chats = "/v1/completions", "/v1/chat/completions"
    return [
        ("malformed JSON", "POST", chats, b'{"model": "x", "messages": [', 400, None),
        ("not an object", "POST", completions, b'["a", "list"]', 400, None),
        ("unknown field", "POST", chats, body(tempreature=0.5), 400, None),
        (
            "wrong type",
            "POST",
            completions,
            b'{"model":"x","prompt":"a","max_tokens":"4"}',
            400,
            None,
        ),
        ("negative max_tokens", "POST", chats, body(max_tokens=-5), 400, None),
        ("wrong messages", "POST", chats, body(messages="hello"), 400, None),
        ("temperature out of range", "POST", chats, body(temperature=7), 400, None),
        ("oversized body", "POST", completions, big, 413, None),
        ("wrong API key", "POST", chats, body(), 401, "not-the-key"),
        ("unknown route", "POST", "/v1/embeddings", body(), 404, None),
        ("wrong method", "GET", chats, None, 405, None),
    ]


def client(soak: Soak, seed: int, deadline: float) -> None:
    """One client thread: requests picked at random until ``deadline`` (soak seconds)."""
    rng = random.Random(seed)
    bad = bad_requests(soak)
    while soak.now() < deadline and not soak.stop.is_set():
        pick = rng.random()
        if pick < 0.70:
            chat, stream, long = rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.3
            body = generation_body(rng, chat, stream, long, soak.long_text)
            kind = "{} {} {}".format(
                "chat" if chat else "completion",
                "stream" if stream else "whole",
                "long" if long else "short",
            )
            path = "/v1/chat/completions" if chat else "/v1/completions"
            soak.add(generate(soak, kind, path, body))
        elif pick < 0.76:
            body = generation_body(rng, rng.random() < 0.5, True, True, soak.long_text)
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            soak.add(generate(soak, "hang up mid-stream", path, body, hang_up=rng.randint(1, 8)))
        elif pick < 0.82:
            body = generation_body(rng, rng.random() < 0.5, False, True, soak.long_text)
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            soak.add(generate(soak, "cancel (hang up)", path, body, hang_up=rng.randint(1, 15)))
        elif pick < 0.96:
            name, method, path, data, expect, key = rng.choice(bad)
            soak.add(plain(soak, f"bad: {name}", method, path, data, expect, key))
        else:
            path = rng.choice(["/v1/models", "/metrics", "/v1/models/nothing"])
            expect = 404 if path.endswith("nothing") else 200
            soak.add(plain(soak, f"GET {path}", "GET", path, None, expect))
        time.sleep(rng.uniform(0.0, 0.5))


def warm_up(soak: Soak, rows: int) -> None:
    """The largest requests of the mix at once (``rows`` ~500-token prompts, then one
    with ``n: 2``): onnxruntime's arena grows to the largest shapes it has run, and that
    high-water mark belongs to the warm-up, not to the growth a leak would show."""
    waves = [[(i % 2 == 0, 1) for i in range(rows)], [(True, 2), (False, 2)]]
    for wave in waves:
        threads = []
        for chat, n in wave:
            body: dict[str, Any] = {"model": "x", "max_tokens": 8, "temperature": 0.7, "n": n}
            text = f"{soak.long_text}\n\nIn one sentence: {QUESTIONS[0]}"
            if chat:
                body["messages"] = [{"role": "user", "content": text}]
            else:
                body["prompt"] = text
            path = "/v1/chat/completions" if chat else "/v1/completions"
            threads.append(
                threading.Thread(
                    target=lambda b=body, p=path: soak.add(generate(soak, "warm-up", p, b))
                )
            )
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def bursts(soak: Soak, size: int, every: float, deadline: float) -> None:
    """Every ``every`` seconds, ``size`` short requests at once (past --max-queue)."""
    while not soak.stop.wait(every) and soak.now() < deadline:
        barrier = threading.Barrier(size)
        body = {"model": "x", "prompt": "Count to ten:", "max_tokens": 32, "temperature": 0}
        body["min_new_tokens"] = 32  # hold the row, whatever the model says

        def one(barrier: threading.Barrier = barrier, body: dict[str, Any] = body) -> None:
            barrier.wait()
            soak.add(generate(soak, "burst", "/v1/completions", body))

        threads = [threading.Thread(target=one) for _ in range(size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def poll_health(soak: Soak) -> None:
    while not soak.stop.is_set():
        started = time.monotonic()
        status: int | None = None
        conn = soak.connect(HEALTH_SLOW_S * 2)
        try:
            conn.request("GET", "/health")
            response = conn.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        took = time.monotonic() - started
        with soak.lock:
            soak.health.append((round(soak.now(), 2), status, round(took, 4)))
        soak.stop.wait(max(0.0, 1.0 - took))


def watch_stalls(soak: Soak, tick: float = 0.1, limit: float = 1.0) -> None:
    """Record when this process itself was not scheduled for over ``limit`` seconds: the
    machine stalled (other work, memory reclaim), not the server."""
    last = time.monotonic()
    while not soak.stop.wait(tick):
        now = time.monotonic()
        if now - last - tick > limit:
            with soak.lock:
                soak.stalls.append((round(last - soak.t0, 2), round(now - last, 2)))
        last = now


def read_rss(pid: int) -> int | None:
    """``VmRSS`` of a process in bytes (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def sample_rss(soak: Soak, every: float) -> None:
    while True:
        rss = read_rss(soak.pid)
        if rss is None:
            return
        with soak.lock:
            soak.rss.append((round(soak.now(), 2), rss))
        if soak.stop.wait(every):
            return


def metrics(soak: Soak) -> dict[str, float]:
    """The samples of ``/metrics`` that are unlabelled or labelled by model only, summed
    over the models."""
    conn = soak.connect(30)
    try:
        conn.request("GET", "/metrics", headers=soak.headers())
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    values: dict[str, float] = {}
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        name, _, labels = series.partition("{")
        if line and not line.startswith("#") and re.fullmatch(r'(model="[^"]*"\})?', labels):
            values[name] = values.get(name, 0.0) + float(value)
    return values


def settle(soak: Soak, wait: float = 15.0) -> dict[str, float]:
    """After the traffic stopped: ``/metrics`` once nothing is in flight (or ``wait`` s)."""
    deadline = time.monotonic() + wait
    while True:
        values = metrics(soak)
        idle = not any(
            values.get(name) for name in ("ortgen_requests_in_flight", "ortgen_queue_length")
        )
        if (idle and not values.get("ortgen_batch_size")) or time.monotonic() > deadline:
            return values
        time.sleep(0.25)


# -- the drain ---------------------------------------------------------------------------


def drain(
    soak: Soak,
    server: subprocess.Popen,
    rows: int,
    grace: float,
    tokens: int = 1500,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """SIGTERM once ``rows`` rows decode: ``rows`` short streams and two requests longer
    than the grace (one streamed, one not) in flight. Each must finish or end with a
    clean error; a new request must get a clean 503; the process must exit 0."""
    long = {"model": "x", "prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0}
    long["min_new_tokens"] = tokens  # not within the grace: it must be cancelled cleanly
    long.update(extra or {})
    jobs: list[tuple[str, dict[str, Any]]] = [("long whole", long)]
    jobs.append(("long stream", {**long, "stream": True}))
    for i in range(rows):
        short = {"model": "x", "max_tokens": 24, "temperature": 0, "stream": True}
        short["messages"] = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        jobs.append(("short stream", short))
    results: list[Result] = []

    def run(name: str, body: dict[str, Any]) -> None:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        results.append(generate(soak, name, path, body))

    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    wait_until = time.monotonic() + 60
    while time.monotonic() < wait_until and _batch_size(soak) < rows:
        if not any(thread.is_alive() for thread in threads):
            break  # a model fast enough to answer them all already
        time.sleep(0.2)  # until the batch is full: requests truly in flight
    term = time.monotonic()
    server.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    hi = json.dumps({"model": "x", "prompt": "hi", "max_tokens": 2}).encode()
    refused = plain(soak, "new request while draining", "POST", "/v1/completions", hi, 503)
    health = plain(soak, "/health while draining", "GET", "/health", None, 503)
    try:
        code = server.wait(grace + 60)
    except subprocess.TimeoutExpired:
        code = None
    exited = time.monotonic() - term
    for thread in threads:
        thread.join(30)
    since = term - soak.t0
    answered = [
        {
            "kind": r.kind,
            "status": r.status,
            "outcome": r.outcome,
            "clean": r.outcome in ("ok", "stream_error", "shutting_down", "rate_limited"),
            "seconds_after_sigterm": round(r.started + r.latency - since, 2),
            "detail": r.detail[:300],
        }
        for r in results
    ]
    return {
        "grace_s": grace,
        "exit_code": code,
        "exit_s": round(exited, 2),
        "last_answer_s": round(
            max((r.started + r.latency for r in results), default=since) - since, 2
        ),
        "requests": answered,
        "unanswered": len(jobs) - len(results),
        "new_request": {"status": refused.status, "clean": refused.outcome == "refused"},
        "health_status": health.status,
    }


def _batch_size(soak: Soak) -> float:
    try:
        return metrics(soak).get("ortgen_batch_size", 0.0)
    except (OSError, http.client.HTTPException):
        return 0.0


# -- the report --------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def summarise_kinds(results: list[Result]) -> dict[str, dict[str, Any]]:
    kinds: dict[str, dict[str, Any]] = {}
    for kind in sorted({r.kind for r in results}, key=_kind_order):
        mine = [r for r in results if r.kind == kind]
        ok = [r for r in mine if r.outcome in ("ok", "refused")]
        ttft = [r.ttft for r in ok if r.ttft is not None]
        kinds[kind] = {
            "requests": len(mine),
            "outcomes": dict(Counter(r.outcome for r in mine)),
            "statuses": {str(k): v for k, v in Counter(r.status for r in mine).items()},
            "latency_p50_s": _r(percentile([r.latency for r in ok], 0.5)),
            "latency_p99_s": _r(percentile([r.latency for r in ok], 0.99)),
            "ttft_p50_s": _r(percentile(ttft, 0.5)),
            "ttft_p99_s": _r(percentile(ttft, 0.99)),
        }
    return kinds


def _kind_order(kind: str) -> tuple[int, str]:
    order = ("warm", "chat", "completion", "hang", "cancel", "burst", "bad", "GET")
    for i, prefix in enumerate(order):
        if kind.startswith(prefix):
            return i, kind
    return 9, kind


def summarise_rss(rss: list[tuple[float, int]], warmup: float, end: float) -> dict[str, Any]:
    """Median RSS of the first window after warm-up against the last window."""
    window = min(60.0, max(10.0, 0.05 * end))
    base = [b for t, b in rss if warmup <= t < warmup + window]
    last = [b for t, b in rss if end - window <= t <= end]
    after = [b for t, b in rss if t >= warmup]
    if not base or not last:
        return {"window_s": window, "growth": None}
    start, final = statistics.median(base), statistics.median(last)
    points = [(t, b) for t, b in rss if warmup <= t <= end]
    times, sizes = [t for t, _ in points], [b for _, b in points]
    slope = statistics.linear_regression(times, sizes).slope if len(points) > 2 else 0.0
    return {
        "slope_mib_per_min": round(slope * 60 / 2**20, 3),
        "window_s": window,
        "warmup_end_bytes": int(start),
        "end_bytes": int(final),
        "peak_after_warmup_bytes": max(after),
        "growth": round(final / start - 1, 4),
        "peak_growth": round(max(after) / start - 1, 4),
    }


def summarise(
    soak: Soak,
    args: argparse.Namespace,
    duration: float,
    end: float,
    settled: dict[str, float],
    drained: dict,
) -> dict[str, Any]:
    results = soak.results
    warmup = 0.1 * duration
    errors: Counter[tuple[int | None, str | None]] = Counter()
    for r in results:
        if r.status is None or r.status >= 400:
            errors[(r.status, r.error_type)] += 1
    five_xx = [
        {"kind": r.kind, "at_s": round(r.started, 1), "status": r.status, "body": r.detail}
        for r in results
        if r.status is not None and r.status >= 500
    ]
    unexpected = [
        {"kind": r.kind, "at_s": round(r.started, 1), "status": r.status, "detail": r.detail}
        for r in results
        if r.outcome in ("unexpected", "stream_error", "shutting_down")
    ]
    throttled = [r for r in results if r.status == 429]
    clean_429 = [r for r in throttled if r.outcome == "rate_limited"]
    polls = soak.health
    bad_polls = [p for p in polls if p[1] != 200 or p[2] > HEALTH_SLOW_S]
    # a slow poll while this client process itself stalled measures the machine
    in_stall = [
        p
        for p in bad_polls
        if p[1] == 200 and any(at < p[0] and p[0] - p[2] < at + d for at, d in soak.stalls)
    ]
    rss = summarise_rss(soak.rss, warmup, end)
    served = [r for r in results if r.outcome == "ok"]
    buckets = Counter(int((r.started + r.latency) // 10) for r in served)
    health_latency = [p[2] for p in polls]
    report: dict[str, Any] = {
        "minutes": round(duration / 60, 2),
        "traffic_s": round(end, 1),
        "warmup_s": round(warmup, 1),
        "seed": args.seed,
        "clients": args.clients,
        "server": {
            "model": args.model or "default",
            "threads": args.threads,
            "max_batch": args.max_batch,
            "max_queue": args.max_queue,
            "grace": args.grace,
            "max_body_bytes": args.max_body_bytes,
        },
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "requests": len(results),
        "served": len(served),
        "kinds": summarise_kinds(results),
        "errors": [
            {"status": status, "type": kind, "count": count}
            for (status, kind), count in sorted(errors.items(), key=lambda e: str(e[0]))
        ],
        "five_xx": five_xx,
        "unexpected": unexpected[:100],
        "unexpected_count": len(unexpected),
        "rate_limited": {
            "total": len(throttled),
            "clean": len(clean_429),
            "with_retry_after": sum(r.retry_after is not None for r in throttled),
        },
        "health": {
            "polls": len(polls),
            "failures": len(bad_polls),
            "failures_in_machine_stalls": len(in_stall),
            "failed_polls": bad_polls[:50],
            "latency_p50_s": _r(percentile(health_latency, 0.5), 4),
            "latency_p99_s": _r(percentile(health_latency, 0.99), 4),
            "latency_max_s": _r(max(health_latency, default=None), 4),
        },
        "rss": rss,
        "machine_stalls": [list(stall) for stall in soak.stalls],
        "rss_series": [[t, b] for t, b in soak.rss],
        "served_per_10s": [[10 * k, buckets.get(k, 0)] for k in range(int(end // 10) + 1)],
        "after_traffic": {
            k.removeprefix("ortgen_"): v
            for k, v in settled.items()
            if k.startswith(
                ("ortgen_requests_in_flight", "ortgen_queue", "ortgen_batch", "ortgen_rows")
            )
        },
        "drain": drained,
    }
    report["goals"] = goals(report)
    return report


def goals(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    rss, health, drained = report["rss"], report["health"], report["drain"]
    limited, after = report["rate_limited"], report["after_traffic"]
    growth = rss.get("growth")
    drain_clean = all(r["clean"] for r in drained["requests"]) and not drained["unanswered"]
    exit_limit = drained["grace_s"] + DRAIN_SLACK_S
    in_flight = len(drained["requests"]) + drained["unanswered"]
    idle = not any(after.get(k) for k in ("requests_in_flight", "queue_length", "batch_size"))
    return {
        "RSS growth after warm-up <= 5%": {
            "met": growth is not None and growth <= RSS_GOAL,
            "measured": "n/a"
            if growth is None
            else f"{100 * growth:+.1f}% "
            f"({rss['warmup_end_bytes'] / 2**20:.0f} -> {rss['end_bytes'] / 2**20:.0f} MiB; "
            f"peak {100 * rss['peak_growth']:+.1f}%)",
        },
        "no 5xx": {"met": not report["five_xx"], "measured": f"{len(report['five_xx'])} 5xx"},
        "every 429 clean (and bursts got 429s)": {
            "met": limited["total"] > 0 and limited["clean"] == limited["total"],
            "measured": f"{limited['clean']} of {limited['total']} clean, "
            f"{limited['with_retry_after']} with Retry-After",
        },
        "every other answer as expected": {
            "met": report["unexpected_count"] == 0,
            "measured": f"{report['unexpected_count']} unexpected of {report['requests']}",
        },
        "/health 200 within 5 s throughout": {
            "met": health["polls"] > 0
            and health["failures"] == health["failures_in_machine_stalls"],
            "measured": f"{health['failures']} failures of {health['polls']} polls "
            f"({health['failures_in_machine_stalls']} slow while the machine stalled: "
            f"{len(report['machine_stalls'])} stalls, longest "
            f"{max((d for _, d in report['machine_stalls']), default=0):.1f} s), "
            f"p50 {health['latency_p50_s']} s, p99 {health['latency_p99_s']} s",
        },
        "nothing in flight after the traffic": {
            "met": idle,
            "measured": "in flight {:.0f}, queued {:.0f}, decoding {:.0f}".format(
                after.get("requests_in_flight", 0),
                after.get("queue_length", 0),
                after.get("batch_size", 0),
            ),
        },
        "SIGTERM drains within --grace": {
            "met": drained["exit_code"] == 0
            and drained["exit_s"] <= exit_limit
            and drain_clean
            and drained["new_request"]["clean"],
            "measured": f"exit {drained['exit_code']} after {drained['exit_s']} s "
            f"(grace {drained['grace_s']} s + {DRAIN_SLACK_S:.0f}); last answer "
            f"{drained['last_answer_s']} s; "
            f"{sum(r['clean'] for r in drained['requests'])} of {in_flight} in flight ended "
            f"cleanly; new request {drained['new_request']['status']}",
        },
    }


def _s(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def table(report: dict[str, Any]) -> str:
    """The report as Markdown tables."""
    lines = [
        f"{report['minutes']} min, {report['clients']} clients, "
        f"warm-up {report['warmup_s']:.0f} s; {report['requests']} requests, "
        f"{report['served']} generations served",
        "",
        "| kind | requests | outcomes | statuses | p50 s | p99 s | TTFT p50 s | TTFT p99 s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, k in report["kinds"].items():
        outcomes = ", ".join(f"{n} {o}" for o, n in sorted(k["outcomes"].items()))
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(k["statuses"].items()))
        lines.append(
            f"| {kind} | {k['requests']} | {outcomes} | {statuses} | {_s(k['latency_p50_s'])} | "
            f"{_s(k['latency_p99_s'])} | {_s(k['ttft_p50_s'])} | {_s(k['ttft_p99_s'])} |"
        )
    lines += ["", "| status | error type | count |", "|---|---|---|"]
    for e in report["errors"]:
        lines.append(f"| {e['status'] or 'no answer'} | {e['type'] or ''} | {e['count']} |")
    for e in report["five_xx"][:20]:
        lines.append(f"5xx: {e['kind']} at {e['at_s']} s: {e['status']} {e['body']}")
    for e in report["unexpected"][:20]:
        lines.append(f"unexpected: {e['kind']} at {e['at_s']} s: {e['status']} {e['detail']}")
    lines += ["", "| goal | measured | met |", "|---|---|---|"]
    for name, goal in report["goals"].items():
        lines.append(f"| {name} | {goal['measured']} | {'yes' if goal['met'] else '**no**'} |")
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="traffic duration (20)")
    parser.add_argument("--seconds", type=float, help="traffic duration in seconds (smoke runs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clients", type=int, default=4, help="client threads (4)")
    parser.add_argument("--model", help="model folder for the server (default model)")
    parser.add_argument("--threads", type=int, help="the server's onnxruntime threads")
    parser.add_argument("--max-batch", type=int, default=4, help="the server's --max-batch (4)")
    parser.add_argument("--max-queue", type=int, default=16, help="the server's --max-queue (16)")
    parser.add_argument("--grace", type=float, default=10.0, help="the server's --grace (10)")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--burst-every", type=float, help="seconds between bursts (60)")
    parser.add_argument("--rss-every", type=float, default=2.0, help="seconds between samples")
    parser.add_argument(
        "--long-prompt-chars",
        type=int,
        default=len(LONG_TEXT),
        help=f"characters of the long prompt ({len(LONG_TEXT)}: ~500 tokens of the default model)",
    )
    parser.add_argument(
        "--drain-tokens", type=int, default=1500, help="tokens of the requests longer than --grace"
    )
    parser.add_argument(
        "--drain-extra",
        metavar="JSON",
        help="more fields for those requests (tests: a slow processor of a --plugin)",
    )
    parser.add_argument("--plugin", action="append", default=[], help="the server's --plugin")
    parser.add_argument("--json", default="benchmarks/results/soak.json", help="report file")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the server, soak it, drain it; the report."""
    duration = args.seconds if args.seconds is not None else 60 * args.minutes
    key = secrets.token_hex(8)
    flags = ["--max-batch", str(args.max_batch), "--max-queue", str(args.max_queue)]
    flags += ["--grace", str(args.grace), "--max-body-bytes", str(args.max_body_bytes)]
    if args.model:
        flags += ["--model", args.model]
    if args.threads:
        flags += ["--threads", str(args.threads)]
    for plugin in args.plugin:
        flags += ["--plugin", plugin]
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - read after the server exits
    server, url = launch(flags, env={**os.environ, "ORTGEN_API_KEY": key}, stderr=log)
    try:
        soak = Soak(url, key, server.pid, args.max_body_bytes)
        soak.long_text = LONG_TEXT[: args.long_prompt_chars]
        every = args.burst_every or min(60.0, duration / 3)
        size = args.max_batch + args.max_queue + 8
        helpers = [
            threading.Thread(target=poll_health, args=(soak,), daemon=True),
            threading.Thread(target=sample_rss, args=(soak, args.rss_every), daemon=True),
            threading.Thread(target=watch_stalls, args=(soak,), daemon=True),
        ]
        traffic = [threading.Thread(target=bursts, args=(soak, size, every, duration))]
        traffic += [
            threading.Thread(target=client, args=(soak, args.seed * 1000 + i, duration))
            for i in range(args.clients)
        ]
        for thread in helpers:
            thread.start()
        warm_up(soak, args.max_batch)
        for thread in traffic:
            thread.start()
        while soak.now() < duration:
            time.sleep(min(30.0, max(0.1, duration - soak.now())))
            rss = soak.rss[-1][1] / 2**20 if soak.rss else 0
            print(
                f"{soak.now():6.0f} s  {len(soak.results)} requests, RSS {rss:.0f} MiB",
                file=sys.stderr,
                flush=True,
            )
        for thread in traffic:
            thread.join()
        end = soak.now()
        settled = settle(soak)
        soak.stop.set()
        for thread in helpers:
            thread.join()
        extra = json.loads(args.drain_extra) if args.drain_extra else None
        drained = drain(soak, server, args.max_batch, args.grace, args.drain_tokens, extra)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    report = summarise(soak, args, duration, end, settled, drained)
    log.seek(0)
    report["server_log_tail"] = log.read()[-4000:]
    return report


def main() -> None:
    args = parse_args()
    report = run(args)
    print(table(report))
    write_report(args.json, report)
    if not all(goal["met"] for goal in report["goals"].values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
