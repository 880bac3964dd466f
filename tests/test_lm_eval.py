"""lm-evaluation-harness (``lm_eval --model local-completions``, its defaults) against a
live ``ortgen serve``, offline: a multiple-choice task scored by log-likelihood and a
generation task, both local (a task YAML and a few JSONL rows written here).

The model is a tiny random Llama exported at fp32 from transformers, so the reference is
transformers on the same weights: each choice's log-likelihood (the sum of the
continuation's token log-probabilities after the context, lm-eval's ``acc``: the
argmax), and the greedy continuation cut at the task's stop string. lm-eval's default
tokenizer backend is "auto": it asks the server's ``GET /tokenizer_info`` and ``POST
/tokenize``, and uses the server's tokenizer when both answer (else it downloads the
model id's tokenizer from the Hugging Face Hub, which fails offline); the run here is
offline (``HF_HUB_OFFLINE=1``), so it shows the server's tokenizer was used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server_helpers import ServerProcess
from tests.tiny_models import EOS_ID, hf_greedy

#: the tiny model's context is 128 characters: short rows (a character is a token)
CHOICE_ROWS = [
    {"question": "The sky is", "choices": ["blue", "green", "loud"], "answer": 0},
    {"question": "Two and two make", "choices": ["three", "four", "five"], "answer": 1},
    {"question": "Ice is", "choices": ["hot", "dry", "cold"], "answer": 2},
    {"question": "A cat says", "choices": ["moo", "meow"], "answer": 1},
    {"question": "Fire is", "choices": ["hot", "wet", "blue", "soft"], "answer": 0},
    {"question": "Snow is", "choices": ["black", "white"], "answer": 1},
]
GENERATE_ROWS = [
    {"question": "Hi?", "answer": "Hello"},
    {"question": "1+1?", "answer": "2"},
    {"question": "Sky?", "answer": "blue"},
]
MAX_GEN = 12

TASKS = """\
task: ortgen_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {choice_rows}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
---
task: ortgen_generate
dataset_path: json
dataset_kwargs:
  data_files:
    test: {generate_rows}
test_split: test
output_type: generate_until
doc_to_text: "Q: {{{{question}}}}\\nA:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: {max_gen}
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


@pytest.fixture(scope="module")
def server(tiny_text_model: Path) -> Iterator[ServerProcess]:
    with ServerProcess("--model", str(tiny_text_model), "--threads", "1") as server:
        yield server


def write_tasks(folder: Path) -> Path:
    """The two tasks (one YAML file each) and their rows, in ``folder``."""
    folder.mkdir()
    paths = {}
    for name, rows in (("choice_rows", CHOICE_ROWS), ("generate_rows", GENERATE_ROWS)):
        paths[name] = folder / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(row) + "\n" for row in rows))
    text = TASKS.format(max_gen=MAX_GEN, **paths)
    for i, task in enumerate(text.split("---\n")):
        (folder / f"task{i}.yaml").write_text(task)
    return folder


def run_lm_eval(server: ServerProcess, tasks: Path, out: Path) -> dict:
    """``lm_eval`` on both tasks, offline; its table printed; results and samples."""
    model_args = f"base_url={server.url}/v1/completions,model={server.model},max_length=128"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(out / "datasets")}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "local-completions",
         "--model_args", model_args, "--include_path", str(tasks),
         "--tasks", "ortgen_choice,ortgen_generate", "--output_path", str(out / "results"),
         "--log_samples"],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    print(done.stdout)  # lm-eval's table
    assert "Using remote tokenizer backend" in done.stderr, done.stderr[-4000:]
    (results,) = (out / "results").rglob("results_*.json")
    samples = {}
    for task in ("ortgen_choice", "ortgen_generate"):
        (path,) = (out / "results").rglob(f"samples_{task}_*.jsonl")
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        samples[task] = sorted(rows, key=lambda row: row["doc_id"])
    return {"results": json.loads(results.read_text())["results"], "samples": samples}


def test_lm_eval_scores_what_transformers_scores(
    server: ServerProcess, tiny_text_model: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = run_lm_eval(server, write_tasks(tmp_path / "tasks"), tmp_path)
    hf_folder = tiny_text_model.parent / "llama-hf"
    hf = AutoModelForCausalLM.from_pretrained(hf_folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(hf_folder)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    def loglikelihood(context: str, continuation: str) -> float:
        ids, tail = encode(context), encode(continuation)
        with torch.no_grad():
            logits = hf(torch.tensor([ids + tail])).logits[0].double()
        scores = torch.log_softmax(logits, dim=-1)
        return sum(float(scores[len(ids) - 1 + i, t]) for i, t in enumerate(tail))

    correct = []
    for row, sample in zip(CHOICE_ROWS, run["samples"]["ortgen_choice"], strict=True):
        # lm-eval's continuation is " " + the choice (its target delimiter)
        reference = [loglikelihood(row["question"], " " + c) for c in row["choices"]]
        served = [float(resp[0][0]) for resp in sample["resps"]]
        assert served == pytest.approx(reference, abs=1e-4), row
        correct.append(reference.index(max(reference)) == row["answer"])
        assert sample["acc"] == float(correct[-1]), row
    accuracy = run["results"]["ortgen_choice"]["acc,none"]
    assert accuracy == pytest.approx(sum(correct) / len(correct))
    assert 0 < accuracy < 1, "a random model should get some rows right and some wrong"

    for row, sample in zip(GENERATE_ROWS, run["samples"]["ortgen_generate"], strict=True):
        new = hf_greedy(hf, encode(f"Q: {row['question']}\nA:"), MAX_GEN)
        if EOS_ID in new:
            new = new[: new.index(EOS_ID)]
        expected = tokenizer.decode(new).split("\n")[0]
        assert sample["resps"][0][0] == expected, row
    assert "exact_match,none" in run["results"]["ortgen_generate"]
