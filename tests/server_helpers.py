"""An ``ortgen serve`` subprocess for tests, plain HTTP calls to it, and the serving
engine run in-process.

Not a test module. The server binds port 0 and prints its URL on one stdout line, so
tests never race for a free port; raw calls use the standard library (the OpenAI client
is for what a client would do, these are for what a client's library would not send).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai

from ortgen.serve.engine import Engine

ROOT = Path(__file__).resolve().parent.parent
KEY = "test-key"


class ServerProcess:
    """``python -m ortgen.cli serve --port 0 ARGS`` (started at once; ``ready()`` waits)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        """``env``: the server's environment (default: this process's)."""
        base = os.environ if env is None else env
        path = os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH")]))
        env = {**base, "PYTHONPATH": path}  # so --plugin tests.server_plugin imports
        env.pop("ORTGEN_API_KEY", None)
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - lives as long as the server
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ortgen.cli", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            cwd=ROOT,
            env=env,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.url = ""
        self.models: list[str] = []  # the ids it serves (the first is the default)
        self.model = ""

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def ready(self, timeout: float = 120.0) -> ServerProcess:
        """Wait for the URL line (the server is listening by then)."""
        if self.url:
            return self
        deadline = time.monotonic() + timeout
        while not self.url:
            try:
                line = self._lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise RuntimeError(f"the server did not start:\n{self.log()}")
            if " at http://" in line:
                served, self.url = line.split(": ", 1)[1].rsplit(" at ", 1)
                self.url = self.url.strip().removesuffix("/v1")
                self.models = served.split(", ")
                self.model = self.models[0]
        return self

    def log(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()

    def client(self, **kwargs: Any) -> openai.OpenAI:
        kwargs.setdefault("api_key", KEY)
        kwargs.setdefault("timeout", 60)
        return openai.OpenAI(base_url=f"{self.url}/v1", max_retries=0, **kwargs)

    def async_client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        kwargs.setdefault("api_key", KEY)
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", max_retries=0, timeout=60, **kwargs)

    def __enter__(self) -> ServerProcess:
        """``with ServerProcess(...) as server``: ready on entry, stopped on exit."""
        return self.ready()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def call(
    server: ServerProcess,
    path: str,
    body: Any = None,
    *,
    key: str | None = KEY,
    raw: bytes | None = None,
) -> tuple[int, Any]:
    """One request (POST when there is a body); (status, parsed JSON or text)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(f"{server.url}{path}", data=data)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    """A sample of ``/metrics``: the sum of ``name``'s series whose labels include
    ``labels`` (every model's when none are given)."""
    _, text = call(server, "/metrics")
    return sum_of(text, name, **labels)


def sum_of(text: str, name: str, **labels: str) -> float:
    """The sum of the series ``name`` in an exposition text, over those whose labels
    include ``labels``; KeyError when there is none."""
    wanted = {f'{key}="{value}"' for key, value in labels.items()}
    found = []
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        base, _, label_text = series.partition("{")
        if base != name:
            continue
        if wanted <= set(label_text.rstrip("}").split(",")) - {""}:
            found.append(float(value))
    if not found:
        raise KeyError(f"{name} {labels}")
    return sum(found)


@contextlib.contextmanager
def running_engine(gen: Any, **options: Any) -> Iterator[Engine]:
    """An in-process serving engine with its loop thread started, shut down however the
    test ends."""
    engine = Engine(gen, **options)
    engine.start()
    try:
        yield engine
    finally:
        engine.shutdown()
