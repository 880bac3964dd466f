"""Prompt logprobs: ``prompt_logprobs=N`` on ``generate``, ``gen.score()``, and the
server's ``echo``, ``max_tokens: 0``, vLLM's ``prompt_logprobs`` and ``/tokenizer_info``.

The library's prompt logprobs are compared with transformers' log-softmax of the same
positions on tiny fp32 models of both graph families (optimum: every position's logits
anyway; fused: asked for through ``logits_to_keep``), across prefill chunks and the
blocks the log-softmax is worked out in. The server is driven with the official
``openai`` client, in the request shapes lm-evaluation-harness's ``local-completions``
sends, and compared with the library on the same folder.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import openai
import pytest
import torch

import ortgen
from ortgen.loop import prompt_scoring
from ortgen.model.session import ForwardBinding
from tests.server_helpers import ServerProcess, call, running_engine
from tests.tiny_models import export_tiny

#: token-id prompts of different lengths (the tiny models' context is 128)
PROMPTS = [
    [5, 17, 42, 99, 3, 64, 8, 150, 77, 31, 12, 200, 45, 9, 61, 88, 19, 250, 33],
    [7, 8, 200, 13],
    [60, 61],
    [40, *range(100, 160)],
]
FAMILIES = [("optimum", "llama"), ("optimum", "gpt2"), ("fused", "llama"), ("fused", "qwen2")]


@pytest.fixture(scope="module", params=FAMILIES, ids=[f"{g}-{a}" for g, a in FAMILIES])
def family(request, tiny_model_dirs, fused_model_dirs):
    """(transformers model, ortgen generator) on the same tiny weights, per graph family."""
    from transformers import AutoModelForCausalLM

    graph, arch = request.param
    hf_dir, onnx_dir = (tiny_model_dirs if graph == "optimum" else fused_model_dirs)[arch]
    hf = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    return SimpleNamespace(hf=hf, gen=ortgen.load(onnx_dir, threads=1), graph=graph)


def _reference(hf, prompt: list[int]) -> np.ndarray:
    """transformers' log-softmax at every position of ``prompt`` (T, V)."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([prompt])).logits[0], dim=-1).numpy()


def _check_against(hf, prompt: list[int], scored: list, top: int) -> float:
    """Assert ``scored`` (one row's prompt logprobs) is transformers'; the max |diff|."""
    reference = _reference(hf, prompt)
    assert len(scored) == len(prompt) and scored[0] is None
    worst = 0.0
    for i, entry in enumerate(scored[1:], start=1):
        row = reference[i - 1]
        assert entry.token == prompt[i]
        worst = max(worst, abs(entry.logprob - float(row[prompt[i]])))
        assert entry.rank == int((row >= row[prompt[i]]).sum())
        assert [t for t, _ in entry.top_logprobs] == np.argsort(-row, kind="stable")[:top].tolist()
        values = [v for _, v in entry.top_logprobs]
        np.testing.assert_allclose(values, np.sort(row)[::-1][:top], atol=1e-4)
    assert worst < 1e-4
    return worst


# -- the library ---------------------------------------------------------------------------


def test_prompt_logprobs_equal_transformers(family):
    """A padded batch in one prefill chunk, then row by row across chunks of 8."""
    out = family.gen.generate(PROMPTS, max_new_tokens=2, prompt_logprobs=3, eos_token_id=None)
    for prompt, scored in zip(PROMPTS, out.prompt_logprobs, strict=True):
        _check_against(family.hf, prompt, scored, 3)
    state = family.gen.start(PROMPTS, max_new_tokens=1, prompt_logprobs=2)
    state.prefill_chunk = 8  # chunk boundaries inside every long prompt
    state.prefill()
    for row, prompt in enumerate(PROMPTS):
        _check_against(family.hf, prompt, state.prompt_logprobs(row), 2)


def test_score_of_a_batch_equals_one_prompt_at_a_time(family):
    batch = family.gen.score(PROMPTS, top_logprobs=2)
    for prompt, together in zip(PROMPTS, batch, strict=True):
        alone = family.gen.score(prompt, top_logprobs=2)
        assert alone.tokens == together.tokens == prompt
        assert alone.logprobs[0] is None and together.logprobs[0] is None
        np.testing.assert_allclose(together.logprobs[1:], alone.logprobs[1:], atol=1e-5)
        assert together.total == pytest.approx(sum(together.logprobs[1:]), abs=1e-6)
        assert together.top_logprobs[0] is None and len(together.top_logprobs[1]) == 2
    reference = _reference(family.hf, PROMPTS[0])
    expected = sum(float(reference[i - 1, t]) for i, t in enumerate(PROMPTS[0]) if i)
    assert batch[0].total == pytest.approx(expected, abs=1e-3)
    packed = [PROMPTS[0], PROMPTS[0][::-1]]  # equal lengths: one batched forward per chunk
    for together, prompt in zip(family.gen.score(packed), packed, strict=True):
        alone = family.gen.score(prompt)
        np.testing.assert_allclose(together.logprobs[1:], alone.logprobs[1:], atol=1e-5)


def test_the_log_softmax_is_worked_out_in_blocks(family, monkeypatch):
    """Blocks of 3 positions (the prompts' lengths are not multiples of it) give what
    the default blocks give, and each block is all the vocabulary-wide memory used."""
    whole = family.gen.score(PROMPTS, top_logprobs=4)
    monkeypatch.setattr(prompt_scoring, "BLOCK", 3)
    blocks = family.gen.score(PROMPTS, top_logprobs=4)
    for a, b in zip(whole, blocks, strict=True):
        assert a.logprobs == b.logprobs and a.top_logprobs == b.top_logprobs


def test_score_positions_is_the_log_softmax():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 4, size=(2, 9, 301)).astype(np.float32)
    rows, steps = np.repeat([0, 1], 9), np.tile(np.arange(9), 2)
    targets = rng.integers(0, 301, size=18)
    scores = prompt_scoring.score_positions(logits, rows, steps, targets, 5, block=4)
    full = torch.log_softmax(torch.from_numpy(logits), dim=-1).numpy()[rows, steps]
    np.testing.assert_allclose(scores.logprobs, full[np.arange(18), targets], atol=1e-5)
    np.testing.assert_allclose(scores.top_values, -np.sort(-full)[:, :5], atol=1e-5)
    assert (scores.ranks == (full >= full[np.arange(18), targets][:, None]).sum(1)).all()


def test_all_positions_are_asked_of_the_graph_only_when_wanted(family, monkeypatch):
    """Ordinary requests feed ``logits_to_keep`` 1 and get one row of logits per forward
    on fused graphs; a request with prompt logprobs asks for every prefill position."""
    kept: list[tuple[int, int]] = []
    forward = ForwardBinding.forward

    def spy(self, input_ids, *args, keep=1, **kwargs):
        logits, presents = forward(self, input_ids, *args, keep=keep, **kwargs)
        kept.append((keep, logits.shape[1]))
        return logits, presents

    monkeypatch.setattr(ForwardBinding, "forward", spy)
    family.gen.generate(PROMPTS[:2], max_new_tokens=3, eos_token_id=None)
    assert {keep for keep, _ in kept} == {1}
    if family.graph == "fused":
        assert {width for _, width in kept} == {1}
    kept.clear()
    family.gen.generate(PROMPTS[1], max_new_tokens=3, eos_token_id=None, prompt_logprobs=0)
    assert kept[0] == (len(PROMPTS[1]), len(PROMPTS[1]))  # the prefill: every position
    assert {keep for keep, _ in kept[1:]} == {1}  # decoding as ever


def test_prompt_logprobs_are_refused_out_of_range_and_per_row(tiny_llama_gen):
    with pytest.raises(ortgen.ConfigError, match="prompt_logprobs"):
        tiny_llama_gen.generate(PROMPTS[1], prompt_logprobs=-1)
    with pytest.raises(ortgen.ConfigError, match="prompt_logprobs"):
        tiny_llama_gen.generate(PROMPTS[1], prompt_logprobs=21)
    with pytest.raises(ortgen.InputError, match="prompt_logprobs"):
        tiny_llama_gen.generate([{"prompt": PROMPTS[1], "prompt_logprobs": 1}])
    with pytest.raises(ortgen.InputError, match="max_new_tokens"):
        tiny_llama_gen.score(PROMPTS[1], max_new_tokens=3)
    assert tiny_llama_gen.generate(PROMPTS[1], max_new_tokens=1).prompt_logprobs is None


@pytest.mark.parametrize("graph", ["optimum", "fused"])
def test_served_rows_score_their_whole_prompt(graph, tiny_model_dirs, fused_model_dirs):
    """Rows of the engine's open batch: a prompt whose prefix a slot holds is still fed
    whole when it asks for prompt logprobs, and equals the library's."""
    import asyncio

    folders = tiny_model_dirs if graph == "optimum" else fused_model_dirs
    gen = ortgen.load(folders["llama"][1], threads=1)
    prompts = [PROMPTS[3], PROMPTS[3][:40], PROMPTS[0]]
    settings = {"max_new_tokens": 2, "eos_token_id": None, "prompt_logprobs": 1}

    async def run(engine):
        handles = [engine.submit(p, settings) for p in prompts]
        return [[piece async for piece in h.pieces()] for h in handles]

    with running_engine(gen, max_batch=2) as engine:
        answers = asyncio.run(run(engine))
    for prompt, pieces in zip(prompts, answers, strict=True):
        assert [p.token for p in pieces] == gen.generate(prompt, **settings).tokens[0]
        want = gen.score(prompt, top_logprobs=1)
        got = pieces[0].prompt_logprobs
        assert got[0] is None and all(p.prompt_logprobs is None for p in pieces[1:])
        np.testing.assert_allclose([g.logprob for g in got[1:]], want.logprobs[1:], atol=1e-4)


def test_a_row_alone_in_the_open_batch_ends_at_its_first_token(fused_model_dirs):
    """A row that joins an empty batch is its settings group of every row; its first
    token's stopping criteria run all the same (``max_tokens: 1``, lm-eval's request,
    gave two tokens before, and a first-token EOS did not end the row)."""
    import asyncio

    gen = ortgen.load(fused_model_dirs["llama"][1], threads=1)
    first = gen.generate(PROMPTS[0], max_new_tokens=1).tokens[0][0]
    cases = [
        {"max_new_tokens": 1, "eos_token_id": None},
        {"max_new_tokens": 5, "eos_token_id": first},
    ]

    async def run(engine, settings):
        return [piece async for piece in engine.submit(PROMPTS[0], settings).pieces()]

    with running_engine(gen, max_batch=2) as engine:
        for settings in cases:
            pieces = asyncio.run(run(engine, settings))
            want = gen.generate(PROMPTS[0], **settings)
            assert [p.token for p in pieces] == want.tokens[0] == [first]
            assert pieces[-1].finish_reason == want.finish_reasons[0]


# -- the server ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("echo")
    folder = export_tiny("llama", root, with_tokenizer=True, graph="fused")
    process = ServerProcess("--model", str(folder), "--threads", "1")
    try:
        yield SimpleNamespace(
            server=process.ready(), client=process.client(), gen=ortgen.load(folder, threads=1)
        )
    finally:
        process.stop()


def _word(gen, token: int) -> str:
    return gen.tokenizer.decode([token], skip_special_tokens=False)


def test_echo_with_max_tokens_0_scores_the_prompt(served):
    gen, prompt = served.gen, "hello there"
    ids = gen.tokenizer.encode(prompt)
    answer = served.client.completions.create(
        model="x", prompt=prompt, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    choice = answer.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (len(ids), 0)
    logprobs = choice.logprobs
    assert logprobs.tokens == [_word(gen, t) for t in ids]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    want = gen.score(ids, top_logprobs=1)
    np.testing.assert_allclose(logprobs.token_logprobs[1:], want.logprobs[1:], atol=1e-4)
    pairs = zip(logprobs.top_logprobs[1:], want.top_logprobs[1:], ids[1:], strict=True)
    for top, best, token in pairs:
        assert set(top) == {_word(gen, best[0][0]), _word(gen, token)}
    offsets = np.cumsum([0, *map(len, logprobs.tokens)])[:-1].tolist()
    assert logprobs.text_offset == offsets


def test_echo_with_generation_puts_the_prompt_first(served):
    gen, prompt = served.gen, "abc de"
    ids = gen.tokenizer.encode(prompt)
    want = gen.generate(ids, max_new_tokens=4, logprobs=True, top_logprobs=2)
    body = dict(model="x", prompt=prompt, max_tokens=4, echo=True, logprobs=2, temperature=0)
    answer = served.client.completions.create(**body)
    logprobs = answer.choices[0].logprobs
    assert answer.choices[0].text == prompt + want.text
    assert logprobs.tokens == [_word(gen, t) for t in ids + want.tokens[0]]
    assert logprobs.token_logprobs[0] is None
    np.testing.assert_allclose(logprobs.token_logprobs[len(ids) :], want.logprobs[0], atol=1e-4)
    offsets = np.cumsum([0, *map(len, logprobs.tokens)])[:-1].tolist()
    assert logprobs.text_offset == offsets  # the answer's continue the prompt's
    assert answer.usage.completion_tokens == len(want.tokens[0])
    chunks = list(served.client.completions.create(**body, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == prompt + want.text
    streamed = [c.choices[0].logprobs for c in chunks]
    lps = [lp for s in streamed for lp in s.token_logprobs]
    assert lps[0] is None
    np.testing.assert_allclose(lps[1:], logprobs.token_logprobs[1:], atol=1e-6)
    assert [o for s in streamed for o in s.text_offset] == logprobs.text_offset
    assert chunks[-1].choices[0].finish_reason == answer.choices[0].finish_reason


def test_what_lm_eval_sends_for_a_loglikelihood(served):
    """lm-evaluation-harness's ``local-completions`` loglikelihood request: token-id
    prompts (context + continuation), ``echo``, ``max_tokens: 1``, ``logprobs: 1``; it
    sums ``token_logprobs[ctxlen:-1]`` and calls a continuation greedy when each of its
    tokens is the best of its ``top_logprobs``."""
    gen = served.gen
    contexts = [gen.tokenizer.encode("The sky is"), gen.tokenizer.encode("one two")]
    continuations = [gen.tokenizer.encode(" blue"), gen.tokenizer.encode(" three")]
    prompts = [c + x for c, x in zip(contexts, continuations, strict=True)]
    body = {
        "model": "x",
        "prompt": prompts,
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    status, answer = call(served.server, "/v1/completions", body)
    assert status == 200, answer
    for choice, prompt, context in zip(answer["choices"], prompts, contexts, strict=True):
        logprobs = choice["logprobs"]
        assert len(logprobs["token_logprobs"]) == len(prompt) + 1  # exactly one generated
        total = sum(logprobs["token_logprobs"][len(context) : -1])
        want = gen.score(prompt)
        assert total == pytest.approx(sum(want.logprobs[len(context) :]), abs=1e-3)
        continuation = logprobs["token_logprobs"][len(context) : -1]
        tops = logprobs["top_logprobs"][len(context) : -1]
        greedy = all(lp == max(top.values()) for lp, top in zip(continuation, tops, strict=True))
        scored = gen.generate(prompt, max_new_tokens=1, prompt_logprobs=0).prompt_logprobs[0]
        ranks = [entry.rank for entry in scored[len(context) :]]
        assert greedy == all(rank == 1 for rank in ranks)


def test_echo_with_several_choices(served):
    answer = served.client.completions.create(
        model="x", prompt=["ab", "cd"], max_tokens=2, echo=True, logprobs=0, n=2, temperature=0
    )
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    for choice in answer.choices:
        assert choice.text.startswith(["ab", "cd"][choice.index // 2])
        assert choice.logprobs.token_logprobs[0] is None and len(choice.logprobs.tokens) == 4
    assert answer.choices[0].logprobs.token_logprobs == answer.choices[1].logprobs.token_logprobs


def test_vllm_prompt_logprobs_on_completions_and_chat(served):
    gen = served.gen
    ids = gen.tokenizer.encode("hello")
    answer = served.client.completions.create(
        model="x", prompt="hello", max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 2}
    )
    listed = answer.choices[0].model_extra["prompt_logprobs"]
    want = gen.generate(ids, max_new_tokens=1, prompt_logprobs=2).prompt_logprobs[0]
    assert listed[0] is None and len(listed) == len(ids)
    for item, entry in zip(listed[1:], want[1:], strict=True):
        first = next(iter(item))  # the prompt's own token comes first
        assert first == str(entry.token) and item[first]["rank"] == entry.rank
        assert item[first]["decoded_token"] == _word(gen, entry.token)
        assert item[first]["logprob"] == pytest.approx(entry.logprob, abs=1e-4)
        assert set(item) == {str(entry.token), *(str(t) for t, _ in entry.top_logprobs)}
    messages = [{"role": "user", "content": "hi"}]
    extra = {"prompt_logprobs": 0}
    chat = served.client.chat.completions.create(
        model="x", messages=messages, max_tokens=2, temperature=0, extra_body=extra
    )
    listed = chat.model_extra["prompt_logprobs"]  # once, for the one prompt (as vLLM)
    prompt = gen.chat_prompt(messages)
    want = gen.score(prompt)
    assert len(listed) == len(prompt) and listed[0] is None
    got = [item[str(token)]["logprob"] for item, token in zip(listed[1:], prompt[1:], strict=True)]
    np.testing.assert_allclose(got, want.logprobs[1:], atol=1e-4)
    assert all(len(item) == 1 for item in listed[1:])


def test_tokenizer_info_in_vllms_shape(served):
    gen = served.gen
    status, info = call(served.server, "/tokenizer_info")
    assert status == 200
    tokenizer = gen.tokenizer
    for key in ("eos_token", "bos_token", "pad_token", "unk_token"):
        assert info[key] == getattr(tokenizer, key)  # what lm-eval's remote tokenizer reads
    assert info["chat_template"] == tokenizer.chat_template
    assert info["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert isinstance(info["model_max_length"], int)
    assert info["clean_up_tokenization_spaces"] is False
    assert not {"vocab_file", "merges_file", "tokenizer_file"} & set(info)
    assert info["added_tokens_decoder"]["2"] == "</s>"  # an AddedToken as its text
    eos = {"prompt": info["eos_token"], "add_special_tokens": False}
    _, ids = call(served.server, "/tokenize", eos)
    assert ids["tokens"] == [tokenizer.eos_token_id]  # lm-eval's eos_token_id


BAD = [
    ("/v1/completions", {"echo": "yes"}, "echo"),
    ("/v1/completions", {"echo": True, "logprobs": 6}, "logprobs"),
    ("/v1/completions", {"prompt_logprobs": -1}, "prompt_logprobs"),
    ("/v1/completions", {"prompt_logprobs": 21}, "prompt_logprobs"),
    ("/v1/completions", {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("/v1/completions", {"max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"max_tokens": -1, "echo": True}, "max_tokens"),
    ("/v1/chat/completions", {"prompt_logprobs": -2}, "prompt_logprobs"),
    ("/v1/chat/completions", {"max_tokens": 0, "prompt_logprobs": 1}, "max_tokens"),
]


@pytest.mark.parametrize(("path", "fields", "param"), BAD, ids=[f"{p}-{f}" for p, f, _ in BAD])
def test_bad_values_are_a_400_naming_the_field(served, path, fields, param):
    body = {"model": "x", "max_tokens": 2}
    messages = [{"role": "user", "content": "hi"}]
    body.update({"messages": messages} if "chat" in path else {"prompt": "hi"})
    status, answer = call(served.server, path, {**body, **fields})
    assert status == 400, answer
    assert answer["error"]["param"] == param, answer


def test_a_refused_echo_request_through_the_client(served):
    with pytest.raises(openai.BadRequestError) as caught:
        served.client.completions.create(model="x", prompt="hi", max_tokens=0)
    assert caught.value.param == "max_tokens"


def test_scoring_memory_stays_within_blocks():
    """A 2,048-position chunk over an 8,192-token vocabulary: what scoring allocates
    beyond the logits is a few (BLOCK, V) temporaries, never the (T, V) log-softmax
    (32 MB here; tracemalloc counts numpy's allocations)."""
    import tracemalloc

    positions, vocab = 2048, 8192
    logits = np.random.default_rng(1).normal(size=(1, positions, vocab)).astype(np.float32)
    steps = np.arange(positions)
    targets = (steps * 7) % vocab
    tracemalloc.start()
    prompt_scoring.score_positions(logits, np.zeros_like(steps), steps, targets, 5)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 * prompt_scoring.BLOCK * vocab * 4  # 8 MB, a quarter of the whole
