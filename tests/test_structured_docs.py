"""docs/structured.md runs: its Python blocks in order, in one namespace, on the default
model, the client block against a live ``ortgen serve`` (its documented address replaced
by the test server's)."""

from __future__ import annotations

import pytest

from tests.server_helpers import ServerProcess
from tests.test_runnable_docs import blocks, run_python

pytestmark = pytest.mark.default_model
PAGE = "docs/structured.md"
DOCUMENTED_URL = "http://127.0.0.1:8000/v1"


def test_the_structured_output_page_runs(default_model_dir, capsys) -> None:
    python = [b for b in blocks(PAGE) if b.lang == "python" and b.not_run is None]
    assert len(python) >= 6
    namespace: dict = {}
    server = ServerProcess("--model", str(default_model_dir), "--threads", "1").ready()
    try:
        for block in python:
            assert DOCUMENTED_URL not in block.code or block.section == "Through the server"
            block.code = block.code.replace(DOCUMENTED_URL, f"{server.url}/v1")
            run_python(PAGE, block, namespace, default_model_dir)
    finally:
        server.stop()
    assert namespace["out"].parsed is not None or namespace["out"].tool_calls is not None
    assert namespace["label"].text in ("positive", "negative")
    assert namespace["call"].function.name == "get_weather"
    assert namespace["follow"].choices[0].finish_reason in ("stop", "tool_calls")
    printed = capsys.readouterr().out
    assert "Lisbon" in printed and "tool_calls" in printed
