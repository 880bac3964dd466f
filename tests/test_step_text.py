"""One driver: the step object keeps each row's text and applies stop strings, so
``start()`` + ``step()``, ``generate()``, ``stream()`` and chat sessions stop at the same
place with the same text."""

from __future__ import annotations

import pytest

from ortgen.errors import InputError
from ortgen.testing import reference_greedy
from tests.text_fixtures import stop_inside

COUNTING = "1, 2, 3, 4, 5, 6,"
STOP = " 9"  # every CPU's default model writes it: test_counting_is_decided_on_every_cpu


def _drive(state) -> str:
    """Step ``state`` to its end the way a server would, collecting streamed text."""
    shown = ""
    while not state.is_done:
        state.step()
        shown += state.new_text(0)
    return shown + state.new_text(0)


def test_start_and_step_honour_stop_strings(default_gen):
    out = default_gen.generate(COUNTING, max_new_tokens=20, stop_strings=[STOP])
    assert out.finish_reasons == ["stop_string"]
    state = default_gen.start(COUNTING, max_new_tokens=20, stop_strings=[STOP])
    shown = _drive(state)
    assert state.finish_reasons == ["stop_string"]
    assert state.generated(0) == out.tokens[0]
    assert state.text(0) == shown == out.text
    assert STOP not in shown


def test_step_text_per_row_in_a_batch(default_gen):
    prompts = [COUNTING, "The capital of France is"]
    out = default_gen.generate(prompts, max_new_tokens=16, stop_strings=[STOP])
    state = default_gen.start(prompts, max_new_tokens=16, stop_strings=[STOP])
    while not state.is_done:
        state.step()
    assert [state.text(r) for r in range(2)] == out.text
    assert state.finish_reasons == out.finish_reasons


def test_text_without_stop_strings_equals_decode(default_gen):
    state = default_gen.start("Write one word:", max_new_tokens=12)
    shown = _drive(state)
    assert shown == state.text(0) == default_gen.tokenizer.decode(state.generated(0))


def test_rewind_keeps_text_in_step_with_tokens(default_gen):
    state = default_gen.start(COUNTING, max_new_tokens=12, eos_token_id=None)
    for _ in range(6):
        state.step()
    before = state.new_text(0)
    state.rewind(3)
    assert state.new_text(0) == ""  # kept text was shown already
    while not state.is_done:
        state.step()
    assert state.text(0) == default_gen.tokenizer.decode(state.generated(0))
    assert state.text(0).startswith(default_gen.tokenizer.decode(state.generated(0)[:3]))
    assert before  # six tokens of counting showed something


def test_chat_session_stops_on_stop_strings(default_gen):
    question = "What is the capital of Germany? Answer in a sentence."
    free = default_gen.chat([{"role": "user", "content": question}], max_new_tokens=24).text
    stop = stop_inside(free)  # from the model's own answer: which words depends on the CPU
    session = default_gen.chat_session(max_new_tokens=24, stop_strings=[stop])
    reply = "".join(session.send(question))
    assert reply == free[: free.index(stop)] and stop not in reply
    assert session.state.finish_reasons == ["stop_string"]
    assert session.messages[-1] == {"role": "assistant", "content": reply}


def test_stop_strings_without_a_tokenizer_are_refused(tiny_llama_gen):
    gen = tiny_llama_gen
    assert gen.tokenizer is None
    with pytest.raises(InputError, match="stop_strings need a tokenizer"):
        gen.start([5, 6, 7], max_new_tokens=2, stop_strings=["x"])
    state = gen.start([5, 6, 7], max_new_tokens=2)
    state.step()
    with pytest.raises(InputError, match="no tokenizer"):
        state.text(0)
    assert gen.generate([5, 6, 7], max_new_tokens=2).text is None


def test_stream_pieces_carry_tokens_logprobs_and_the_finish_reason(default_gen):
    settings = dict(max_new_tokens=20, stop_strings=[STOP], logprobs=True, top_logprobs=2)
    out = default_gen.generate(COUNTING, **settings)
    pieces = list(default_gen.stream_pieces(COUNTING, **settings))
    assert "".join(p.text for p in pieces) == out.text
    assert [p.token for p in pieces] == out.tokens[0]
    assert [p.logprob for p in pieces] == out.logprobs[0]
    assert [p.top_logprobs for p in pieces] == out.top_logprobs[0]
    assert [p.finish_reason for p in pieces] == [None] * (len(pieces) - 1) + ["stop_string"]


@pytest.mark.default_model
@pytest.mark.parametrize(("prompt", "stop"), [(COUNTING, STOP), ("Count: 1, 2, 3,", " 7")])
def test_counting_is_decided_on_every_cpu(reference_gen, prompt, stop):
    """Why the counting tests may name their stop string (here and in tests/test_threads.py):
    at float32 every token up to and past it is chosen by more than ``NEAR_TIE`` (measured:
    margins >= 3.1), so the int8 default model writes it on any CPU (its logits stay within
    ``NEAR_TIE`` of these)."""
    tok = reference_gen.tokenizer
    ref = reference_greedy(reference_gen, tok.encode(prompt), 12)
    assert stop in tok.decode(ref.tokens[: ref.stable_length()]), ref.margins
