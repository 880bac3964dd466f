"""The server soaks on a tiny model, briefly. ``benchmarks/soak.py`` for a few seconds:
its whole traffic mix (streams and not, chat and completions, bad requests, hang-ups, a
burst past ``--max-queue``, ``/health`` polls, the SIGTERM drain) runs, the server
answers no 5xx and nothing unexpected, and the report has the shape the docs and the
plot read. ``benchmarks/soak_memory.py`` for a few requests: every kind of its mix is
answered well formed and RSS is read where the report says.

The RSS goals need minutes and 1,000 requests, not seconds: they are the long runs'
(docs/benchmarks.md), never asserted here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def _benchmark(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as a module (its own imports are siblings of it)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses resolve their annotations there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


@pytest.fixture(scope="module")
def soak() -> ModuleType:
    return _benchmark("soak")


def test_soak_mix_on_tiny_model(
    soak, tiny_text_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the drain's long requests decode slowly (tests/server_plugin.py), so SIGTERM finds
    # them in flight and the grace ends with them cancelled
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    slow = json.dumps({"logits_processors": [{"name": "slow", "delay": 0.1}]})
    args = soak.parse_args(
        [
            "--seconds", "5", "--model", str(tiny_text_model), "--threads", "1",
            "--clients", "3", "--max-batch", "2", "--max-queue", "4", "--grace", "2",
            "--burst-every", "2", "--rss-every", "0.5", "--long-prompt-chars", "20",
            "--drain-tokens", "64", "--plugin", "tests.server_plugin", "--drain-extra", slow,
            "--json", str(tmp_path / "soak.json"),
        ]
    )  # fmt: skip
    report = soak.run(args)
    assert report["five_xx"] == [], report["five_xx"]
    assert report["unexpected_count"] == 0, report["unexpected"]
    goals = report["goals"]
    for name in (
        "no 5xx",
        "every 429 clean (and bursts got 429s)",
        "every other answer as expected",
        "/health 200 within 5 s throughout",
        "nothing in flight after the traffic",
        "SIGTERM drains within --grace",
    ):
        assert goals[name]["met"], (name, goals[name], report["drain"], report["server_log_tail"])
    assert "RSS growth after warm-up <= 5%" in goals  # measured; minutes decide it

    kinds = report["kinds"]
    assert "warm-up" in kinds and "burst" in kinds
    assert any(k.startswith(("chat", "completion")) for k in kinds)
    assert report["served"] == sum(k["outcomes"].get("ok", 0) for k in kinds.values()) > 0
    assert report["rate_limited"]["total"] > 0
    assert report["health"]["polls"] >= 3
    assert len(report["rss_series"]) >= 3 and all(b > 0 for _, b in report["rss_series"])
    drained = report["drain"]
    assert drained["exit_code"] == 0 and drained["new_request"]["status"] == 503
    ends = {r["kind"]: r["outcome"] for r in drained["requests"]}
    assert ends["long whole"] == "shutting_down" and ends["long stream"] == "stream_error"
    assert {r["kind"] for r in drained["requests"]} == {"long whole", "long stream", "short stream"}

    table = soak.table(report)
    assert "| kind | requests |" in table and "| goal | measured | met |" in table
    soak.write_report(args.json, report)
    assert json.loads(Path(args.json).read_text())["goals"] == json.loads(json.dumps(goals))


def test_memory_soak_on_tiny_model(tiny_text_model: Path, tmp_path: Path) -> None:
    memory = _benchmark("soak_memory")
    args = memory.parse_args(
        [
            "--requests", "12", "--every", "4", "--clients", "2", "--seed", "3",
            "--model", str(tiny_text_model), "--threads", "1", "--max-batch", "2",
            "--max-prompt-tokens", "24", "--max-tokens", "4", "--settle", "0.5",
            "--json", str(tmp_path / "memory.json"),
        ]
    )  # fmt: skip
    report = memory.run(args)
    assert report["failed_count"] == 0, (report["failed_requests"], report["server_log_tail"])
    assert report["requests"] == 12
    kinds = {r.split()[0] for r in report["kinds"]}
    assert kinds == {"free", "json_schema", "regex"}, report["kinds"]
    assert {int(k.split()[1][1:]) for k in report["kinds"]} > {1}  # n above 1 too
    assert [s["requests"] for s in report["samples"]] == [4, 8, 12]
    first, end = report["rss_after_first"], report["rss_end"]
    assert first > 0 and end == report["samples"][-1]["rss"] > 0
    assert report["end_over_first"] == round(end / first, 3)
    assert report["rss_hwm"] >= max(first, end)
    assert report["passed"] == (end / first <= 1.5)
    parts = report["parts"]
    for when in ("after_first", "end"):  # the kernel's split of VmRSS, to a page or so
        assert parts[f"RssAnon_{when}"] > 0 and parts[f"RssFile_{when}"] > 0
    table = memory.table(report)
    assert ("PASS" if report["passed"] else "FAIL") + ": RSS at the end is" in table
