"""What a request leaves behind: ``error.partial`` when a component fails mid-batch, the
onnxruntime session options that ``threads``/``spinning`` set, and chat sessions that
keep their cache over several turns yet answer exactly like a fresh ``chat()``."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ortgen
from ortgen import hookimpl
from ortgen.model.session import DEFAULT_SPIN_US

PROMPTS = [[5, 17, 42, 99, 3, 64], [7, 8], [200, 13, 55, 1, 9, 9, 9, 31, 77]]
FAIL_AT = 6  # the failing processor raises when asked for the 7th token (step 6)


class FailAtStep:
    """Passes the scores through, then raises at decoding step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.calls = 0

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.calls == self.step:
            raise RuntimeError(f"boom at call {self.calls}")
        self.calls += 1
        return scores.copy()


class FailingPlugin:
    @hookimpl
    def register_logits_processors(self, register):
        register("fail_at_step", FailAtStep)


@pytest.fixture(scope="module")
def gen(tiny_model_dirs):
    return ortgen.load(tiny_model_dirs["llama"][1], threads=1, plugins=[FailingPlugin()])


@pytest.fixture(scope="module")
def eos(gen) -> int:
    """A token row 1 reaches at step 3 (before the failure) and the other rows do not
    reach before the failure, so the batch is mixed when the processor raises."""
    free = gen.generate(PROMPTS, max_new_tokens=12, eos_token_id=None).tokens
    for step in range(3):
        candidate = free[1][step]
        if all(candidate not in free[r][: FAIL_AT + 1] for r in (0, 2)):
            return candidate
    pytest.fail(f"no usable EOS in this tiny model's output: {free}")


def test_partial_output_of_a_batch_with_finished_rows(gen, eos):
    settings = dict(max_new_tokens=12, eos_token_id=eos)
    full = gen.generate(PROMPTS, **settings)
    assert full.finish_reasons[1] == "eos" and len(full.tokens[1]) <= 3
    spec = [{"name": "fail_at_step", "step": FAIL_AT}]
    with pytest.raises(ortgen.ComponentError, match=f"'fail_at_step' failed at step {FAIL_AT}"):
        gen.generate(PROMPTS, logits_processors=spec, **settings)
    try:
        gen.generate(PROMPTS, logits_processors=spec, **settings)
    except ortgen.ComponentError as exc:
        error = exc
    partial = error.partial
    assert isinstance(partial, ortgen.GenerationOutput)
    assert isinstance(error.__cause__, RuntimeError)
    # the row that finished keeps its tokens (EOS included) and its reason
    assert partial.tokens[1] == full.tokens[1] and partial.finish_reasons[1] == "eos"
    # the others have exactly the tokens of the steps before the failure
    for row in (0, 2):
        assert partial.tokens[row] == full.tokens[row][:FAIL_AT], row
        assert partial.finish_reasons[row] == "error"
    # text and sequences agree with the tokens (left padding, then generated tokens)
    width = max(map(len, PROMPTS))
    assert partial.sequences.shape == (3, width + FAIL_AT)
    for row, prompt in enumerate(PROMPTS):
        assert partial.sequences[row, width - len(prompt) : width].tolist() == prompt
        generated = partial.sequences[row, width:].tolist()
        assert generated[: len(partial.tokens[row])] == partial.tokens[row]
    assert partial.text is None  # this model folder has no tokenizer


def test_generator_stays_usable_after_a_failure(gen, eos):
    settings = dict(max_new_tokens=12, eos_token_id=eos)
    before = gen.generate(PROMPTS, **settings)
    with pytest.raises(ortgen.ComponentError):
        gen.generate(PROMPTS, logits_processors=[{"name": "fail_at_step", "step": 2}], **settings)
    after = gen.generate(PROMPTS, **settings)
    assert after.tokens == before.tokens and after.finish_reasons == before.finish_reasons


def test_failure_at_the_first_step_has_empty_rows(gen):
    spec = [{"name": "fail_at_step", "step": 0}]
    with pytest.raises(ortgen.ComponentError, match="at step 0") as info:
        gen.generate(PROMPTS, logits_processors=spec, max_new_tokens=5, eos_token_id=None)
    partial = info.value.partial
    assert partial.tokens == [[], [], []]
    assert partial.finish_reasons == ["error"] * 3


# --------------------------------------------------------------------------- session options


def allow_spinning(gen) -> tuple[str, str]:
    options = gen.model.session.get_session_options()
    return (
        options.get_session_config_entry("session.intra_op.allow_spinning"),
        options.get_session_config_entry("session.inter_op.allow_spinning"),
    )


def spin_duration(gen) -> str | None:
    """The bounded spin in microseconds, or None when the session sets none."""
    options = gen.model.session.get_session_options()
    try:
        return options.get_session_config_entry("session.intra_op.spin_duration_us")
    except RuntimeError:  # onnxruntime raises for a key that was never set
        return None


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_reach_the_session(tiny_model_dirs, threads):
    gen = ortgen.load(tiny_model_dirs["llama"][1], threads=threads)
    options = gen.model.session.get_session_options()
    assert options.intra_op_num_threads == threads
    assert options.inter_op_num_threads == 1
    # by default a short bounded spin, not onnxruntime's unbounded one
    assert allow_spinning(gen) == ("1", "1")
    assert spin_duration(gen) == str(DEFAULT_SPIN_US)


def test_default_threads_are_the_usable_cores(tiny_model_dirs):
    gen = ortgen.load(tiny_model_dirs["llama"][1])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert gen.model.session.get_session_options().intra_op_num_threads == cores


def test_spinning_reaches_the_session(tiny_model_dirs):
    folder = tiny_model_dirs["llama"][1]
    on = ortgen.load(folder, threads=2, spinning=True)
    never = ortgen.load(folder, threads=2, spin_us=0)
    bounded = ortgen.load(folder, threads=2, spin_us=250)
    assert (allow_spinning(on), spin_duration(on)) == (("1", "1"), None)
    assert (allow_spinning(never), spin_duration(never)) == (("0", "0"), None)
    assert (allow_spinning(bounded), spin_duration(bounded)) == (("1", "1"), "250")
    same = dict(max_new_tokens=6, eos_token_id=None)
    tokens = on.generate(PROMPTS[0], **same).tokens
    assert never.generate(PROMPTS[0], **same).tokens == tokens
    assert bounded.generate(PROMPTS[0], **same).tokens == tokens


@pytest.mark.parametrize("bad", [-1, 2.5, True, "10"])
def test_bad_spin_us_is_refused(tiny_model_dirs, bad):
    with pytest.raises(ortgen.InputError, match="spin_us must be a non-negative integer"):
        ortgen.load(tiny_model_dirs["llama"][1], spin_us=bad)


def test_cli_spin_us_reaches_the_session(default_model_dir, monkeypatch):
    from ortgen import cli

    seen = {}
    real = ortgen.api.load

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ortgen.api, "load", spy)
    folder = str(default_model_dir)
    argv = ["generate", "Hi", "-m", folder, "--spin-us", "0", "--max-new-tokens", "1"]
    assert cli.main(argv) in (0, None)
    assert seen["spin_us"] == 0


# --------------------------------------------------------------------------- chat sessions


@pytest.mark.default_model
def test_multi_turn_chat_session_equals_fresh_chats(reference_gen):
    """Four turns; each answer equals a fresh chat() on the same history (greedy), and
    from the second turn on the earlier turns are not fed again. On the default model's
    weights at fp32: the quantised default variant's logits depend on how positions are
    split between forwards (a cached turn vs a whole prompt), so it is not token-exact."""
    settings = dict(max_new_tokens=12)
    session = reference_gen.chat_session(
        [{"role": "system", "content": "You are brief."}], **settings
    )
    questions = ["My name is Ana.", "What is 2 + 2?", "Name a colour.", "What is my name?"]
    for turn, question in enumerate(questions):
        held = session.state.length if session.state is not None else 0
        answer = "".join(session.send(question))
        history = session.messages[:-1]
        assert history[-1] == {"role": "user", "content": question}
        assert session.messages[-1] == {"role": "assistant", "content": answer}
        fresh = reference_gen.chat(history, **settings)
        assert answer == fresh.text, turn
        assert session.state.generated(0) == fresh.tokens[0], turn
        if turn == 0:
            assert session.reused_tokens == 0
        else:
            assert session.reused_tokens == held > 0, turn  # everything held was reused
    assert [m["role"] for m in session.messages] == ["system"] + ["user", "assistant"] * 4


@pytest.mark.default_model
def test_chat_session_settings_per_turn(reference_gen):
    """Settings given to send() apply to that turn only, over the session's."""
    session = reference_gen.chat_session(max_new_tokens=10)
    first = "".join(session.send("Count from one to twenty.", max_new_tokens=3))
    history = session.messages[:-1]
    assert first == reference_gen.chat(history, max_new_tokens=3).text
    second = "".join(session.send("Again, please."))
    history = session.messages[:-1]
    fresh = reference_gen.chat(history, max_new_tokens=10)
    assert second == fresh.text
    assert len(session.state.generated(0)) == len(fresh.tokens[0])


# The same on tiny fp32 models, where the cache continuation must be exact: token ids
# through next_turn() (every arch), and a text ChatSession whose answers re-tokenize to
# the same ids (the character tokenizer's printable range only), so the cache is reused.


def drive(state) -> list[int]:
    while not state.is_done:
        state.step()
    return state.generated(0)


def test_next_turn_over_five_turns_equals_fresh_generates(tiny_model_dirs, tiny_arch):
    gen = ortgen.load(tiny_model_dirs[tiny_arch][1], threads=1)
    settings = dict(max_new_tokens=5, eos_token_id=None)
    turns = [[5, 17, 42, 99], [7, 8, 9], [200, 13, 55, 1], [33, 44], [66, 77, 88]]
    state, prompt = None, []
    for turn, new in enumerate(turns):
        prompt = (state.sequences[0].tolist() if state is not None else []) + new
        previous = state
        state = gen.next_turn(state, prompt, **settings)
        assert (state is previous) == (turn > 0), "the cache was not carried over"
        assert drive(state) == gen.generate(prompt, **settings).tokens[0], turn


@pytest.fixture(scope="module")
def text_gen(tmp_path_factory):
    from tests.tiny_models import export_tiny

    folder = export_tiny("llama", tmp_path_factory.mktemp("chat-tiny"), with_tokenizer=True)
    return ortgen.load(folder, threads=1)


def test_tiny_chat_session_reuses_the_cache_over_four_turns(text_gen):
    printable = {text_gen.tokenizer.encode(c, add_special_tokens=False)[0] for c in "abcxyz .?"}
    assert len(printable) == 9
    # only printable characters (ids 4..98) may be generated: they re-tokenize as they were
    banned = [[i] for i in (0, 1, 2, 3, *range(99, 256))]
    settings = dict(max_new_tokens=3, eos_token_id=None, bad_words_ids=banned)
    session = text_gen.chat_session(**settings)
    for turn, question in enumerate(["Hi", "Why?", "Ok", "Go"]):
        held = session.state.length if session.state is not None else 0
        answer = "".join(session.send(question))
        fresh = text_gen.chat(session.messages[:-1], **settings)
        assert answer == fresh.text and len(answer) == 3, turn
        assert session.reused_tokens == held and (held > 0) == (turn > 0), turn


@pytest.mark.default_model
def test_chat_batch_answers_as_fresh_chats_and_feeds_only_new_turns(reference_gen):
    """Two conversations answered together over three turns: each answer equals a fresh
    chat() on that history (greedy, default weights at fp32), and from the second turn
    on each row's history comes from the prefix store (only the new turn is fed)."""
    settings = dict(max_new_tokens=10)
    batch = reference_gen.chat_batch(
        [
            [{"role": "system", "content": "You are brief."}],
            [{"role": "system", "content": "You answer in one word."}],
        ],
        **settings,
    )
    turns = [["My name is Ana.", "Name a fruit."], ["What is my name?", "Name a colour."]]
    turns.append(["Thanks!", "And an animal?"])
    for turn, questions in enumerate(turns):
        held = [len(reference_gen.chat_prompt(c)) for c in batch.conversations]
        answers = batch.send(questions)
        for row, answer in enumerate(answers):
            history = batch.conversations[row][:-1]
            assert history[-1] == {"role": "user", "content": questions[row]}
            assert batch.conversations[row][-1] == {"role": "assistant", "content": answer}
            assert answer == reference_gen.chat(history, **settings).text, (turn, row)
        # from the second turn on, most of what each row held was reused (the template may
        # re-render its end); the first may reuse what earlier tests stored for this model
        if turn:
            assert batch.reused_tokens >= 0.8 * sum(held), turn


def test_chat_batch_refuses_a_wrong_number_of_messages_and_keeps_its_history(text_gen):
    batch = text_gen.chat_batch([[{"role": "user", "content": "hi"}]] * 2, max_new_tokens=2)
    with pytest.raises(ortgen.InputError, match="one message per conversation"):
        batch.send(["only one"])
    with pytest.raises(ortgen.InputError, match="one message per conversation"):
        batch.send("a string")
    with pytest.raises(ortgen.InputError, match="num_return_sequences must be 1"):
        batch.send(["a", "b"], num_return_sequences=2, do_sample=True)
    assert [len(c) for c in batch.conversations] == [1, 1]
    with pytest.raises(ortgen.InputError, match="at least one conversation"):
        text_gen.chat_batch([])
    one = [{"role": "user", "content": "hi"}]  # one conversation, not a list of them
    for bad in ("hello", one, [["x"]]):
        with pytest.raises(ortgen.InputError, match="a list of conversations"):
            text_gen.chat_batch(bad)


def test_ray_job_refuses_a_bad_spin_us_before_starting_ray(tmp_path):
    from ortgen.config.pipeline import Pipeline
    from ortgen.jobs.ray_engine import run_ray_job

    with pytest.raises(ortgen.InputError, match="spin_us must be a non-negative integer"):
        run_ray_job(Pipeline(), tmp_path / "rows.jsonl", tmp_path / "out.jsonl", spin_us=-1)
    assert not (tmp_path / "out.jsonl").exists()  # nothing opened, nothing to redo
