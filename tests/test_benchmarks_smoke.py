"""Smoke tests of the benchmarks: ``benchmarks/compare.py``'s checks and summary, and
``ortgen bench --json --prompt-ids --reference`` (what compare.py runs for ortgen), on a
tiny model. The numbers are not checked (a tiny random model's speed means nothing);
what compare.py does with them is: a peer run that returns fewer tokens or stops early
is a failed run, not a sample; ratios and the greedy-prefix column come from the runs;
each engine's quality (perplexity, top-1 agreement with the reference) is in one table.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import ortgen
from ortgen.bench.quality import eval_ids, score_tokens

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("compare", BENCHMARKS / "compare.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["compare"] = module  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("compare", None)


def _result(tokens: list[int], decode: float, **extra) -> dict:
    return {
        "decode_tokens_per_s": decode, "prefill_tokens_per_s": 10 * decode,
        "peak_rss_mb": 100.0, "load_s": 0.5, "first_token_s": 0.1,
        "greedy_tokens": tokens, **extra,
    }  # fmt: skip


def test_a_run_with_another_token_count_or_an_early_stop_is_a_failure(compare) -> None:
    assert compare.run_problem({"greedy_tokens": [1, 2, 3, 4]}, 4) is None
    assert "3 greedy tokens, not the 4" in compare.run_problem({"greedy_tokens": [1, 2, 3]}, 4)
    assert "5 greedy tokens" in compare.run_problem({"greedy_tokens": [1, 2, 3, 4, 5]}, 4)
    assert "no greedy tokens" in compare.run_problem({}, 4)
    early = {"greedy_tokens": [1, 2], "stopped_early": True}
    assert compare.run_problem(early, 4) == "stopped early (2 of 4 tokens)"
    # the same counts go through run_once: a runner that stops early is a failed run
    engine = compare.Engine("genai-int4", "genai", Path(sys.executable), "unused", Path("."))
    engine.command = lambda *_: [sys.executable, "-c", _fake_runner([7, 8], stopped_early=True)]
    args = type("Args", (), {"new_tokens": 4, "timeout": 60})()
    assert compare.run_once(engine, Path("unused"), args, 1) == "stopped early (2 of 4 tokens)"
    engine.command = lambda *_: [sys.executable, "-c", _fake_runner([7, 8, 9, 10])]
    assert compare.run_once(engine, Path("unused"), args, 1)["greedy_tokens"] == [7, 8, 9, 10]
    engine.command = lambda *_: [sys.executable, "-c", _fake_runner([7, 8, 9])]
    assert "3 greedy tokens" in compare.run_once(engine, Path("unused"), args, 1)


def _fake_runner(tokens: list[int], **extra) -> str:
    return f"import json; print(json.dumps({_result(tokens, 50.0, **extra)!r}))"


def test_the_summary_medians_ratios_prefix_and_quality_table(compare) -> None:
    keys = [("llama.cpp", "run_llama_cpp.py"), ("genai-int4", "run_genai.py"),
            ("ortgen", "run_ortgen.py"), ("torch-fp32", "run_transformers.py")]  # fmt: skip
    engines = [compare.Engine(k, k.upper(), Path("py"), script, Path("m")) for k, script in keys]
    reference = [5, 6, 7, 8]
    tokens = {"llama.cpp": [5, 6, 0, 0], "genai-int4": [5, 0, 0, 0], "ortgen": [5, 6, 7, 0],
              "torch-fp32": reference}  # fmt: skip
    speed = {"llama.cpp": [40, 50, 60], "genai-int4": [80, 100, 90], "ortgen": [70, 75, 80],
             "torch-fp32": [20, 20, 20]}  # fmt: skip
    runs = [
        {"round": r, "threads": 1, "engine": key, "result": _result(tokens[key], speed[key][r])}
        for r in range(3)
        for key in tokens
    ]
    runs.append({"round": 1, "threads": 1, "engine": "ortgen", "error": "stopped early"})
    ref = {"perplexity": 18.5, "top1": [1, 2, 3, 4], "file": "unused"}
    peer = compare.peer_quality({"perplexity": 27.7, "top1": [1, 2, 0, 4], "eval_tokens": 5}, ref)
    assert peer == {"perplexity": 27.7, "reference_perplexity": 18.5, "agreement_top1": 0.75,
                    "eval_tokens": 5}  # fmt: skip
    ours = {"perplexity": 18.4, "reference_perplexity": 18.5, "agreement_top1": 0.95}
    runs += [
        {"round": None, "threads": 1, "engine": "genai-int4", "quality": True, "result": peer},
        {"round": None, "threads": 1, "engine": "ortgen", "quality": True, "result": ours},
    ]
    rows = {row["engine"]: row for row in compare.summarise(engines, runs, [1])}
    ortgen_row = rows["ortgen"]
    assert ortgen_row["runs"] == 3  # the failed run and the quality run are not samples
    assert ortgen_row["decode_tokens_per_s"] == 75
    assert ortgen_row["decode_vs_llama"] == pytest.approx(75 / 50)
    assert ortgen_row["decode_vs_genai_int4"] == pytest.approx(75 / 90)
    assert [rows[k]["greedy_prefix_vs_reference"] for k, _ in keys] == [2, 1, 3, 4]
    assert ortgen_row["perplexity"] == 18.4 and rows["genai-int4"]["agreement_top1"] == 0.75
    meta = {"prompt_tokens": 30, "new_tokens": 4, "rounds": 3, "machine": "cpu", "cores": 2,
            "loadavg_1min_median": 0.1, "threads": [1], "reference": "fp32"}  # fmt: skip
    table = compare.markdown(list(rows.values()), meta)
    assert "| ORTGEN | 75.0 |" in table and "| 3/4 |" in table
    quality = table[table.index("**Quality**") :]
    assert "| GENAI-INT4 | 27.700 | 18.500 | 75.0% |" in quality
    assert "| ORTGEN | 18.400 | 18.500 | 95.0% |" in quality
    with pytest.raises(ValueError, match="3 positions scored"):
        compare.peer_quality({"perplexity": 1.0, "top1": [1, 2, 3]}, ref)


def test_ortgen_bench_json_with_prompt_ids_and_a_reference(tiny_text_model, tmp_path) -> None:
    """What compare.py runs for ortgen, on a tiny model that is its own reference: the
    greedy tokens are generate's for the given ids, agreement is 1, the perplexity is
    ``score_tokens``' on the evaluation text."""
    prompt = [5, 17, 42, 99, 3, 64, 7, 8]
    ids_file = tmp_path / "ids.json"
    ids_file.write_text(json.dumps(prompt))
    command = [
        sys.executable, "-m", "ortgen.cli", "bench", "--json", "--model", str(tiny_text_model),
        "--prompt-ids", str(ids_file), "--new-tokens", "6", "--no-do-sample",
        "--reference", str(tiny_text_model), "--eval-tokens", "120",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    gen = ortgen.load(tiny_text_model, threads=1)
    expected = gen.generate(prompt, max_new_tokens=6, eos_token_id=None, do_sample=False)
    assert report["greedy_tokens"] == expected.tokens[0]
    assert report["prompt_tokens"] == [len(prompt)] and report["new_tokens"] == 6
    assert report["agreement_top1"] == 1.0
    scores = score_tokens(gen, eval_ids(gen)[:120])
    assert report["perplexity"] == pytest.approx(scores.perplexity, rel=1e-3)
    assert report["reference_perplexity"] == pytest.approx(scores.perplexity, rel=1e-3)


def test_compare_py_end_to_end_on_a_tiny_model(tiny_text_model, tmp_path) -> None:
    """compare.py with one ortgen column on a tiny model: one round, its JSON and markdown;
    the timed run counts ortgen's import in ``load_s`` as the peers' runners do, and the
    quality pass reports the perplexity and agreement with the reference."""
    ids_file = tmp_path / "ids.json"
    ids_file.write_text(json.dumps([5, 17, 42, 99, 3, 64, 7, 8]))
    out = tmp_path / "compare.json"
    command = [
        sys.executable, str(BENCHMARKS / "compare.py"), "--engines", "ortgen", "--rounds", "1",
        "--threads", "1", "--new-tokens", "5", "--prompt-ids", str(ids_file), "--chart", "",
        "--out", str(out), "--ortgen-models", f"tiny={tiny_text_model}",
        "--reference", str(tiny_text_model), "--main-python", sys.executable,
        "--eval-tokens", "120",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    saved = json.loads(out.read_text())
    (row,) = saved["summary"]
    assert row["engine"] == "ortgen:tiny" and row["runs"] == 1
    assert len(row["greedy_tokens"]) == 5
    (timed,) = [r["result"] for r in saved["runs"] if not r.get("quality")]
    assert 0 < timed["import_s"] < timed["load_s"]
    assert row["agreement_top1"] == 1.0 and row["perplexity"] > 1
    assert "**Quality**" in out.with_suffix(".md").read_text()


def test_model_switch_on_a_tiny_model(tiny_text_model) -> None:
    """benchmarks/model_switch.py on a tiny model: every request switches (--max-loaded
    1), each load is reported, and both ids answer the same tokens."""
    command = [
        sys.executable, "benchmarks/model_switch.py", "--model", str(tiny_text_model),
        "--switches", "4",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "over 3 loads" in done.stdout
    assert "both ids answer the same: True" in done.stdout


def test_ab_settings_on_a_tiny_model(tiny_text_model) -> None:
    """benchmarks/ab_settings.py: A runs with ortgen.load's defaults, B with ortgen
    serve's memory settings (each in a process of its own), and both sides are timed."""
    command = [
        sys.executable, "benchmarks/ab_settings.py", "--model", str(tiny_text_model),
        "--rounds", "2", "--prefills", "1", "--prompt-tokens", "40",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "A: onnxruntime's CPU arena on, an arena per thread" in done.stdout
    assert "B: onnxruntime's CPU arena off, one heap" in done.stdout
    assert "(medians of 16)" in done.stdout and "prefill 40 tokens" in done.stdout
