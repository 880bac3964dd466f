"""Smoke tests of ``benchmarks/gguf.py`` (GGUF files against llama.cpp, issue 37) without
llama-cpp-python: tiny GGUF files stand in for the re-quantised default model, and the
benchmark runs ortgen alone (``--no-llama``): each file built through ortgen's cache, its
bytes per decode step and bits per weight, the timed runs through ``ortgen bench --model
FILE.gguf``. The numbers of a tiny random model mean nothing; what is checked is the
arithmetic (bits per weight of the exact layouts, what llama.cpp reads of a tied model),
the round-robin order and the goals' bookkeeping.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from gguf import GGMLQuantizationType as Q

from tests.gguf_models import write_tiny_gguf

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    """benchmarks/gguf.py as a module, under a name that cannot shadow gguf-py."""
    spec = importlib.util.spec_from_file_location("bench_gguf", BENCHMARKS / "gguf.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gguf"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("bench_gguf", None)


def test_a_script_of_the_benchmarks_folder_still_imports_gguf_py(tmp_path: Path) -> None:
    """benchmarks/gguf.py shadows gguf-py for the scripts beside it (their folder comes
    first on sys.path): imported as ``gguf``, it puts gguf-py in its place."""
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(BENCHMARKS)!r})\n"
        "import gguf\nfrom gguf.quants import dequantize\n"
        "import compare\n"  # the folder is still on sys.path for the script's siblings
        "print(gguf.GGUFReader.__module__, callable(dequantize))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["gguf.gguf_reader", "True"]


def test_round_robin_rotates_the_files_and_swaps_the_engines(bench) -> None:
    engines = bench.engines_for(["Q4_1", "Q8_0", "Q4_0"], _args(bench, Path("unused")))
    keys = lambda r: [e.key for e in bench.round_order(engines, r)]  # noqa: E731
    assert keys(0) == ["ortgen:Q4_1", "llama.cpp:Q4_1", "ortgen:Q8_0", "llama.cpp:Q8_0",
                       "ortgen:Q4_0", "llama.cpp:Q4_0"]  # fmt: skip
    assert keys(1) == ["llama.cpp:Q8_0", "ortgen:Q8_0", "llama.cpp:Q4_0", "ortgen:Q4_0",
                       "llama.cpp:Q4_1", "ortgen:Q4_1"]  # fmt: skip
    assert keys(2)[:2] == ["ortgen:Q4_0", "llama.cpp:Q4_0"]


def test_the_summary_ratios_and_goals(bench) -> None:
    """1.2x is the goal of the 4-bit files, 1.0x of the others; ratios of medians."""
    runs = [
        {"engine": key, "threads": 1, "result": {"decode_tokens_per_s": tok_s, "peak_rss_mb": 100}}
        for key, speeds in {
            "ortgen:Q4_0": [110, 112, 100], "llama.cpp:Q4_0": [100, 90, 100],
            "ortgen:Q8_0": [66, 60, 63], "llama.cpp:Q8_0": [60, 60, 61],
        }.items()
        for tok_s in speeds
    ]  # fmt: skip
    report = {"meta": {"threads": [1]}, "files": {"Q4_0": {}, "Q8_0": {}}}
    q4, q8 = bench.summarise(["Q4_0", "Q8_0"], report, runs)
    assert q4["t1"]["decode_ratio"] == pytest.approx(1.1)
    assert q4["t1"]["goal"] == 1.2 and q4["t1"]["goal_met"] is False
    assert q8["t1"]["decode_ratio"] == pytest.approx(1.05)
    assert q8["t1"]["goal"] == 1.0 and q8["t1"]["goal_met"] is True


def test_gguf_bench_end_to_end_on_tiny_files_without_llama_cpp(bench, tmp_path: Path) -> None:
    """Tiny tied llama GGUFs named as the benchmark's files: built, measured for bytes and
    nodes, decoded through ``ortgen bench --model FILE.gguf``; no llama.cpp column."""
    kinds = {"Q4_1": Q.Q4_1, "Q4_K_M": Q.Q4_K, "Q8_0": Q.Q8_0}
    for kind, qtype in kinds.items():
        write_tiny_gguf(
            tmp_path / bench.gguf_files.file_name(kind), "llama", qtype=qtype, tied=True
        )
    out = tmp_path / "gguf.json"
    command = [
        sys.executable, str(BENCHMARKS / "gguf.py"), "--gguf-dir", str(tmp_path),
        "--types", *kinds, "--rounds", "1", "--threads", "1", "--new-tokens", "4",
        "--prompt-tokens", "8", "--no-quality", "--no-llama", "--main-python", sys.executable,
        "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    saved = json.loads(out.read_text())
    rows = {row["type"]: row for row in saved["summary"]}
    assert set(rows) == set(kinds)
    assert saved["meta"]["prompt_tokens"] == 8
    for kind, row in rows.items():
        assert row["build"]["build_s"] > 0 and row["build"]["peak_rss_mb"] > 0
        assert Path(row["build"]["folder"]).parent == tmp_path / "cache" / ".gguf"
        assert row["mix"]["tensors"][kinds[kind].name] == 15  # 2 layers x 7 + the embedding
        # the file's bits per weight, and the exact layout's: fp32 scales (and minimum)
        layout = row["layout"][kinds[kind].name]
        gguf_bpw, ortgen_bpw = {"Q4_1": (5.0, 6.0), "Q4_K_M": (4.5, 6.0), "Q8_0": (8.5, 9.0)}[kind]
        assert layout["gguf_bits_per_weight"] == pytest.approx(gguf_bpw)
        assert layout["ortgen_bits_per_weight"] == pytest.approx(ortgen_bpw)
        # tied: llama.cpp reads the embedding in full as the LM head, plus one row
        theirs = row["llama_reads"]
        assert theirs["per_token"] == pytest.approx(
            theirs["file_tensors"] + theirs["embedding_row"]
        )
        reads = row["graph"]["read_per_token"]
        assert reads["total"] > reads["nbits_codes"] > 0
        assert (reads.get("minimum", 0) > 0) == (kind != "Q8_0")  # Q4_1 / Q4_K carry minimums
        assert row["runtime_nodes"]["nodes"] <= row["graph"]["nodes"]
        timed = row["t1"]
        assert timed["ortgen"]["runs"] == 1 and len(timed["ortgen"]["greedy_tokens"]) == 4
        assert timed["llama"] is None and timed["decode_ratio"] is None
    table = out.with_suffix(".md").read_text()
    assert "| Q4_K_M | Q4_K 15 |" in table
    assert "**Bytes and nodes per decode step**" in table


def _args(bench: ModuleType, gguf_dir: Path) -> object:
    return type("Args", (), {"gguf_dir": str(gguf_dir), "main_python": sys.executable})()
