"""Beam search, a sampler plugin that moves rows: token for token (and score for score)
against transformers' ``generate(num_beams=...)`` on the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ortgen
from tests.tiny_models import PAD_ID

PROMPTS = [[5, 17, 42, 99, 3, 64], [7, 8], [200, 13, 55, 1, 9, 9, 9, 31, 77]]
SETTINGS = [
    dict(num_beams=3),
    dict(num_beams=4, num_return_sequences=3, length_penalty=0.5),
    dict(num_beams=3, early_stopping=True),
    dict(num_beams=2, early_stopping="never", repetition_penalty=1.3),
    dict(num_beams=3, length_penalty=-1.0, no_repeat_ngram_size=2),
]


def hf_beams(hf, prompts: list[list[int]], *, pad: int = PAD_ID, **settings):
    """transformers' greedy beam search on left-padded ``prompts`` (pad id ``pad``)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        return hf.generate(
            ids,
            attention_mask=mask,
            do_sample=False,
            pad_token_id=pad,
            output_scores=True,
            return_dict_in_generate=True,
            **settings,
        )


def _eos_met_early(gen, prompt: list[int]) -> int:
    """A token the greedy continuation reaches at its third step, so some beams end."""
    return gen.generate(prompt, max_new_tokens=3, eos_token_id=None).tokens[0][2]


@pytest.mark.parametrize(
    "settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
def test_beam_search_equals_transformers(models, settings):
    hf, gen = models
    for prompts in ([PROMPTS[0]], PROMPTS):
        for eos in (None, _eos_met_early(gen, PROMPTS[0])):
            call = dict(max_new_tokens=10, eos_token_id=eos, **settings)
            expected = hf_beams(hf, prompts, **call)
            out = gen.generate(prompts, **call)
            theirs = expected.sequences.numpy()
            width = max(map(len, prompts))
            np.testing.assert_array_equal(out.sequences[:, :width], theirs[:, :width])
            assert out.sequences.shape == theirs.shape
            # transformers fills after a sequence ends with `pad_token_id or eos[0]` (so
            # with eos when the pad id is 0): compare the generated tokens themselves
            fill = {PAD_ID, -1} | ({eos} if eos is not None else set())
            for row, tokens in enumerate(out.tokens):
                assert tokens == theirs[row, width : width + len(tokens)].tolist()
                assert set(theirs[row, width + len(tokens) :].tolist()) <= fill
            np.testing.assert_allclose(
                out.sequence_scores, expected.sequences_scores.numpy(), rtol=1e-4, atol=1e-5
            )
            per_prompt = settings.get("num_return_sequences", 1)
            assert len(out.tokens) == len(prompts) * per_prompt


def test_finished_beams_report_eos(tiny_llama_gen):
    gen = tiny_llama_gen
    eos = gen.generate(PROMPTS[0], max_new_tokens=1, eos_token_id=None).tokens[0][0]  # step 1
    out = gen.generate(
        PROMPTS[0], num_beams=3, num_return_sequences=3, max_new_tokens=10, eos_token_id=eos
    )
    assert any(reason == "eos" for reason in out.finish_reasons)
    for tokens, reason in zip(out.tokens, out.finish_reasons, strict=True):
        assert (tokens[-1] == eos) == (reason == "eos")
        assert eos not in tokens[:-1]


def test_beam_sampling_is_seeded_and_returns_distinct_beams(tiny_llama_gen):
    call = dict(num_beams=4, num_return_sequences=4, do_sample=True, max_new_tokens=8)
    call.update(eos_token_id=None, temperature=1.5, top_k=0)
    first = tiny_llama_gen.generate(PROMPTS[1], seed=3, **call)
    again = tiny_llama_gen.generate(PROMPTS[1], seed=3, **call)
    other = tiny_llama_gen.generate(PROMPTS[1], seed=4, **call)
    assert first.tokens == again.tokens and first.tokens != other.tokens
    assert len({tuple(t) for t in first.tokens}) == 4
    assert first.sequence_scores == sorted(first.sequence_scores, reverse=True)


@pytest.mark.parametrize("prompts", [[PROMPTS[0]], PROMPTS], ids=["one", "padded-batch"])
def test_beam_logprobs_and_scores_equal_transformers(models, prompts):
    """Per-step processed log-probabilities (``output_scores``, in the running beams' order,
    as transformers returns them) and each returned token's log-probability (transformers'
    ``compute_transition_scores`` with ``beam_indices``)."""
    hf, gen = models
    eos = _eos_met_early(gen, PROMPTS[0])
    call = dict(num_beams=3, num_return_sequences=2, max_new_tokens=8, eos_token_id=eos)
    expected = hf_beams(hf, prompts, **call)
    out = gen.generate(
        prompts, logprobs=True, top_logprobs=3, output_scores=True, output_logits=True, **call
    )
    assert len(out.scores) == len(expected.scores) == len(out.logits)
    for ours, theirs in zip(out.scores, expected.scores, strict=True):
        theirs = theirs.numpy()
        np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))
        finite = np.isfinite(theirs)
        np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-4, atol=1e-4)
    transition = hf.compute_transition_scores(
        expected.sequences, expected.scores, expected.beam_indices
    ).numpy()
    for row, (tokens, logprobs) in enumerate(zip(out.tokens, out.logprobs, strict=True)):
        assert len(logprobs) == len(tokens)
        np.testing.assert_allclose(logprobs, transition[row, : len(tokens)], rtol=1e-4, atol=1e-4)
        # the sequence score is their sum over length ** length_penalty (1.0 here)
        assert out.sequence_scores[row] == pytest.approx(sum(logprobs) / len(tokens), abs=1e-4)
        # each token's best alternatives: the top 3 of the scores of the beam it was
        # picked in (transformers' scores at that step, row beam_indices[row, step])
        assert len(out.top_logprobs[row]) == len(tokens)
        for step, alternatives in enumerate(out.top_logprobs[row]):
            beam_scores = expected.scores[step][int(expected.beam_indices[row, step])].numpy()
            best = np.argsort(-beam_scores, kind="stable")[:3]
            assert [token for token, _ in alternatives] == best.tolist(), (row, step)
            values = [value for _, value in alternatives]
            np.testing.assert_allclose(values, beam_scores[best], rtol=1e-4, atol=1e-4)
            assert tokens[step] in best.tolist() or logprobs[step] <= values[-1] + 1e-4


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(num_beams=2, num_return_sequences=3), "must be <= num_beams"),
        (dict(num_beams=2, stop_strings=["x"]), "beam_search: stop_strings need the model's"),
        (dict(num_beams=0), "num_beams must be >= 1"),
    ],
)
def test_beam_search_refuses_what_it_cannot_do(tiny_llama_gen, settings, message):
    with pytest.raises(ortgen.ConfigError, match=message):
        tiny_llama_gen.generate(PROMPTS[0], max_new_tokens=4, **settings)


def test_a_third_party_search_strategy_is_a_sampler_with_parents(tiny_llama_gen):
    """The extended contract: a sampler that sets ``parents`` moves rows; ``done`` ends
    the request; ``finalize`` returns what it chose. Here: keep row 0's beam twice."""

    class CopyFirstRow:
        def __init__(self):
            self.parents = None
            self.done = False
            self.steps = 0

        def __call__(self, input_ids, scores):
            self.parents = np.zeros(len(scores), dtype=np.int64)  # every row follows row 0
            self.steps += 1
            self.done = self.steps == 3
            return np.full(len(scores), int(scores[0].argmax()), dtype=np.int64)

        def finalize(self, input_ids):
            return [input_ids[0, -3:].tolist()], [0.0]

    class Plugin:
        @ortgen.hookimpl
        def register_samplers(self, register):
            register("copy_first_row", CopyFirstRow)

    gen = ortgen.load(tiny_llama_gen.path, threads=1, plugins=[Plugin()])
    out = gen.generate([PROMPTS[0], PROMPTS[0]], sampler="copy_first_row", max_new_tokens=8)
    greedy = gen.generate(PROMPTS[0], max_new_tokens=3, eos_token_id=None).tokens[0]
    assert out.tokens == [greedy]


@pytest.mark.default_model
def test_beam_search_on_the_default_model_at_fp32_equals_transformers(reference_gen, default_hf):
    hf = default_hf
    prompt = reference_gen.chat_prompt([{"role": "user", "content": "Name a colour."}])
    call = dict(num_beams=3, num_return_sequences=2, max_new_tokens=16, eos_token_id=2)
    expected = hf_beams(hf, [prompt], pad=2, **call).sequences
    out = reference_gen.generate(prompt, **call)
    assert len(out.tokens) == len(out.finish_reasons) == expected.shape[0] == 2
    for row, tokens in enumerate(out.tokens):
        theirs = expected[row, len(prompt) :].tolist()
        assert tokens and tokens == theirs[: len(tokens)], row
        assert set(theirs[len(tokens) :]) <= {2}, row  # the tail: only transformers' padding
    for tokens, reason in zip(out.tokens, out.finish_reasons, strict=True):
        assert (tokens[-1] == 2) == (reason == "eos")
        assert reason == "eos" or len(tokens) == 16


@pytest.mark.default_model
def test_beam_search_with_stop_strings_equals_transformers(reference_gen, default_hf):
    """A candidate whose last token completes a stop string ends like one ending on EOS
    (transformers' StopStringCriteria in its beam search): the same sequences, token for
    token, with the stop string found mid-text (" is", ".") and in most beams (","); the
    text is cut before it and the finish reason says so, as for greedy decoding."""
    from transformers import AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(reference_gen.path)
    cases = [
        ("Name a colour.", ["."]),
        ("Write a short poem about the sea.", [","]),
        ("List three fruits.", ["\n"]),
        ("What is 2+2?", [" is"]),
    ]
    call = dict(num_beams=3, num_return_sequences=3, max_new_tokens=24, eos_token_id=2)
    reasons = []
    for content, stops in cases:
        prompt = reference_gen.chat_prompt([{"role": "user", "content": content}])
        expected = hf_beams(
            default_hf, [prompt], pad=2, stop_strings=stops, tokenizer=hf_tokenizer, **call
        ).sequences
        out = reference_gen.generate(prompt, stop_strings=stops, **call)
        for row, (tokens, text, reason) in enumerate(
            zip(out.tokens, out.text, out.finish_reasons, strict=True)
        ):
            theirs = expected[row, len(prompt) :].tolist()
            assert tokens == theirs[: len(tokens)], (content, row)
            assert set(theirs[len(tokens) :]) <= {2}
            decoded = reference_gen.tokenizer.decode(tokens)
            if reason == "stop_string":
                cut = min(i for i in (decoded.find(s) for s in stops) if i >= 0)
                assert text == decoded[:cut]
            else:
                assert text == decoded and not any(s in decoded for s in stops)
            reasons.append(reason)
    assert reasons.count("stop_string") >= 6 and "eos" in reasons and "length" in reasons


@pytest.fixture(scope="module")
def text_gen(tmp_path_factory: pytest.TempPathFactory):
    from tests.tiny_models import export_tiny

    folder = export_tiny("llama", tmp_path_factory.mktemp("beams-text"), with_tokenizer=True)
    return ortgen.load(folder, threads=1)


def test_stream_of_a_search_is_its_chosen_text_in_one_piece(text_gen):
    """stream() with beams: the best sequence's text, once the search has chosen (the
    step-by-step text of a row that beams move about would not be the answer)."""
    call = dict(num_beams=3, max_new_tokens=16, eos_token_id=None)
    pieces = list(text_gen.stream("Once upon", **call))
    assert pieces == [text_gen.generate("Once upon", **call).text]
    greedy = text_gen.generate("Once upon", max_new_tokens=16, eos_token_id=None).text
    assert pieces[0] != greedy, "beams would not be tested"


def test_a_search_row_has_no_text_until_it_has_chosen(text_gen):
    state = text_gen.start("Once upon", num_beams=2, max_new_tokens=4, eos_token_id=None)
    state.step()
    with pytest.raises(ortgen.InputError, match="a search strategy's rows move"):
        state.new_text(0)
