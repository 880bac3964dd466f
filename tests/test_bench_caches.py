"""``ortgen bench --cache A --cache B``: backends side by side, each in its own process,
with speed, memory and output reported apart (and a plot of the per-step traces)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortgen.cli import main


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "prompt.json"
    path.write_text(json.dumps([1, *range(10, 40)]))
    return path


def test_backends_side_by_side(tiny_model_dirs, prompt_file: Path, tmp_path: Path, capsys) -> None:
    folder = tiny_model_dirs["llama"][1]
    plot = tmp_path / "caches.png"
    args = ["bench", "-m", str(folder), "--prompt-ids", str(prompt_file), "--new-tokens", "40"]
    caches = ["dynamic", "static", "sliding_window:window=8,sink=2", "prefix"]
    for cache in caches:
        args += ["--cache", cache]
    assert main([*args, "--json", "--plot", str(plot)]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [r["cache"] for r in reports] == caches
    by_name = {r["cache"]: r for r in reports}
    dynamic = by_name["dynamic"]["greedy_tokens"]
    assert len(dynamic) == 40
    assert by_name["static"]["greedy_tokens"] == dynamic
    assert by_name["prefix"]["greedy_tokens"] == dynamic
    assert by_name["sliding_window:window=8,sink=2"]["greedy_tokens"] != dynamic
    sig_bytes = by_name["dynamic"]["kv_cache_bytes"] / (31 + 39)  # bytes per position
    assert by_name["sliding_window:window=8,sink=2"]["kv_cache_bytes"] <= (8 + 2) * sig_bytes
    window_trace = by_name["sliding_window:window=8,sink=2"]["trace"]
    assert len({kv for _, _, kv in window_trace}) == 1  # flat memory
    assert by_name["dynamic"]["trace"][-1][2] > by_name["dynamic"]["trace"][0][2]  # grows
    assert plot.stat().st_size > 10_000


def test_one_backend_prints_a_table(tiny_model_dirs, prompt_file: Path, capsys) -> None:
    folder = tiny_model_dirs["llama"][1]
    args = ["bench", "-m", str(folder), "--prompt-ids", str(prompt_file), "--new-tokens", "5"]
    assert main([*args, "--cache", "static"]) == 0
    out = capsys.readouterr().out
    assert "decode tok/s" in out and "KV cache MiB" in out and "static" in out


def test_plot_without_cache_is_refused(tiny_model_dirs, prompt_file: Path, capsys) -> None:
    folder = tiny_model_dirs["llama"][1]
    args = ["bench", "-m", str(folder), "--prompt-ids", str(prompt_file), "--plot", "x.png"]
    assert main(args) == 2  # a usage problem
    assert "give at least one --cache" in capsys.readouterr().err


def test_an_unknown_backend_is_named(tiny_model_dirs, prompt_file: Path, capsys) -> None:
    folder = tiny_model_dirs["llama"][1]
    args = ["bench", "-m", str(folder), "--prompt-ids", str(prompt_file), "--cache", "slidng"]
    assert main(args) == 2  # a usage problem
    assert "unknown kv_cache 'slidng'" in capsys.readouterr().err
