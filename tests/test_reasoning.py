"""Thinking: splitting a reply into reasoning and answer (whole and streaming), the
grammar that leaves the thought free and holds the answer to a constraint, and the
``thinking_budget`` processor, alone and with that grammar on a tiny Qwen3-style model.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import jsonschema
import llguidance
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ortgen
from ortgen.chat_formats import (
    THINK_TAGS,
    ReasoningStream,
    after_thought,
    opens_thought,
    split_reasoning,
)
from ortgen.chat_formats import reasoning as reasoning_module
from ortgen.errors import ConfigError
from ortgen.plugin_host.chains import processor_specs
from ortgen.plugins.thinking import ThinkingBudget
from ortgen.structured.check import check_constraint, grammar_text
from ortgen.testing import check_logits_processor, check_sparse, make_context
from tests.grammar_reference import reference_tokenizer
from tests.tiny_models import EOS_ID, VOCAB_SIZE, export_chat_family, save_tiny_tokenizer

SPECIALS = ("<think>", "</think>", "<|im_start|>", "<|im_end|>")
#: a Qwen3-style template whose generation prompt opens the thought (as DeepSeek-R1's does)
QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "n"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Is it?"}]


# -- splitting a whole reply ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "opened", "expected"),
    [
        ("<think>\nplan\n</think>\n\nThe answer.", False, ("plan", "The answer.")),
        ("  \n<think>a b </think>  x  ", False, ("a b", "x  ")),
        ("The answer.", False, (None, "The answer.")),
        ("  The answer. ", False, (None, "  The answer. ")),
        ("x <think>no</think>", False, (None, "x <think>no</think>")),
        ("<think></think>answer", False, ("", "answer")),
        ("<think>\n\n</think>\n\n", False, ("", "")),
        ("<think>cut by the limit ", False, ("cut by the limit", "")),
        ("", False, (None, "")),
        ("\nplan\n</think>\n\nanswer", True, ("plan", "answer")),
        ("plan</think>a</think>b", True, ("plan", "a</think>b")),
        ("still thinking", True, ("still thinking", "")),
        ("", True, ("", "")),
        ("<think>x</think>y", True, ("<think>x", "y")),  # opened: no open tag is looked for
    ],
)
def test_split_reasoning(text: str, opened: bool, expected: tuple[str | None, str]) -> None:
    assert split_reasoning(text, THINK_TAGS, opened=opened) == expected


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("<|im_start|>assistant\n<think>\n", True),  # DeepSeek-R1's generation prompt
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),  # Qwen3 without thinking
        ("<|im_start|>assistant\n", False),
        ("<think>a</think> then <think>b", True),
        ("<think>a</think> then </think>", False),
    ],
)
def test_opens_thought(prompt: str, expected: bool) -> None:
    assert opens_thought(prompt, THINK_TAGS) is expected


@pytest.mark.parametrize("tags", [("<think>",), (" <t>", "</t>"), ("<t>", ""), "ab"])
def test_tags_are_checked(tags) -> None:
    with pytest.raises(ValueError, match="tag"):
        split_reasoning("x", tags, opened=False)


# -- streaming ---------------------------------------------------------------------------


def _streamed(pieces: list[str], tags: tuple[str, str], opened: bool) -> tuple[str, str]:
    stream = ReasoningStream(tags, opened=opened)
    deltas = [d for piece in pieces for d in stream.feed(piece)] + stream.finish()
    assert all(kind in ("reasoning", "answer") and text for kind, text in deltas), deltas
    reasoning = "".join(text for kind, text in deltas if kind == "reasoning")
    return reasoning, "".join(text for kind, text in deltas if kind == "answer")


def _splits(text: str):
    """Every way to cut ``text`` into pieces (2 ** (len - 1) of them: short texts only)."""
    assert len(text) <= 12
    for cuts in itertools.product((False, True), repeat=max(0, len(text) - 1)):
        pieces, start = [], 0
        for index, cut in enumerate(cuts, 1):
            if cut:
                pieces.append(text[start:index])
                start = index
        yield [*pieces, text[start:]]


_T = ("<t>", "</t>")


@pytest.mark.parametrize(
    ("text", "tags"),
    [
        (" <t> a </t>b", _T),
        ("<t>x</</t>", _T),
        ("\n<t k>", _T),
        ("a\n </t>\n b", _T),
        ("<think></thi", THINK_TAGS),
        ("[T] x[/T]y", ("[T]", "[/T]")),
        ("<a b>c</a b>", ("<a b>", "</a b>")),  # a tag with a space inside
    ],
)
def test_every_split_streams_as_the_whole_splits(text: str, tags: tuple[str, str]) -> None:
    for opened in (False, True):
        reasoning, answer = split_reasoning(text, tags, opened=opened)
        for pieces in _splits(text):
            assert _streamed(pieces, tags, opened) == (reasoning or "", answer), (pieces, opened)


_TAG_SETS = [THINK_TAGS, ("[T]", "[/T]"), ("<a b>", "</a b>")]
_BITS = ["<think>", "</think>", "<th", "</t", "<", "/", ">", "k", " ", "\n", "\t", "a", "xy"]


@st.composite
def _pieces(draw):
    tags = draw(st.sampled_from(_TAG_SETS))
    bits = st.sampled_from([*_BITS, *tags, tags[0][:2], tags[1][:3], tags[1][1:]])
    text = "".join(draw(st.lists(bits, max_size=14)))
    cuts = sorted(draw(st.sets(st.integers(0, len(text)), max_size=6)))
    bounds = [0, *cuts, len(text)]
    return tags, text, [text[a:b] for a, b in itertools.pairwise(bounds)]


@given(_pieces(), st.booleans())
def test_any_split_streams_as_the_whole_splits(drawn, opened: bool) -> None:
    tags, text, pieces = drawn
    reasoning, answer = split_reasoning(text, tags, opened=opened)
    assert _streamed(pieces, tags, opened) == (reasoning or "", answer)


def test_the_stream_sends_what_it_can_at_once() -> None:
    stream = ReasoningStream(THINK_TAGS, opened=True)
    assert stream.feed("\nstep one") == [("reasoning", "step one")]
    assert stream.feed("\n</th") == []  # a newline (stripped if the thought ends) and a tag
    assert stream.feed("ink>\n\nThe") == [("answer", "The")]
    assert stream.feed(" end.") == [("answer", " end.")]
    assert stream.finish() == []


# -- the grammar: free to think, strict to answer -----------------------------------------


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    from ortgen.text import load_tokenizer

    folder = save_tiny_tokenizer(tmp_path_factory.mktemp("think-tok"), special_tokens=SPECIALS)
    return load_tokenizer(Path(folder))


@pytest.fixture(scope="module")
def ll_tokenizer(tiny_tokenizer):
    return reference_tokenizer(tiny_tokenizer, VOCAB_SIZE, (EOS_ID,))


def _accepts(ll_tokenizer, tokenizer, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
    assert not matcher.is_error(), matcher.get_error()
    ids = tokenizer.encode(text, add_special_tokens=False)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


CONSTRAINTS = {
    "json_schema": (SCHEMA, '{"answer":"no","n":3}', '{"answer":"maybe","n":3}'),
    "json_object": (True, '{"a":[1]}', "[1]"),
    "regex": (r"[0-9]{3}/[a-c]+", "123/ab", "12/ab"),
    "grammar": ('start: "(" NUM ")"\nNUM: /[0-9]+/', "(42)", "(x)"),
    "choice": (["red", "blue sky"], "blue sky", "blue"),
}


@pytest.mark.parametrize("setting", sorted(CONSTRAINTS))
def test_after_thought_is_free_to_think_and_strict_to_answer(
    setting: str, ll_tokenizer, tiny_tokenizer
) -> None:
    value, good, bad = CONSTRAINTS[setting]
    for opened in (False, True):
        grammar = after_thought(setting, value, THINK_TAGS, opened=opened)
        failed, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
        assert not failed, warnings
        check_constraint("grammar", grammar)  # the `grammar` setting takes it as is
        assert grammar_text("grammar", grammar) == grammar

        def accepts(text: str, grammar: str = grammar) -> bool:
            return _accepts(ll_tokenizer, tiny_tokenizer, grammar, text)

        thought = "" if opened else "<think>"
        assert accepts(f"{thought}\nany <think> text, {{[\n</think>\n\n{good}")
        assert accepts(f"{thought}</think>{good}")  # the close tag at any point
        assert accepts(f"{thought}a</thi</th</think> {good}")  # a tag's start is text
        assert not accepts(f"{thought}plan</think>\n{bad}")  # the answer is held to it
        assert not accepts(f"{thought}plan</think>{good}</think>")
        assert not accepts(f"{thought}plan")  # a thought must close
        assert not accepts(f"{thought}plan</think>" + " " * 9 + good)  # at most 8 spaces
        assert accepts(good) is (not opened)  # without the prompt's, the thought is optional


def test_after_thought_with_other_tags_and_a_grammar_of_grammars(
    ll_tokenizer, tiny_tokenizer
) -> None:
    inner = after_thought("choice", ["ok"], ("[r]", "[/r]"), opened=True)
    grammar = after_thought("grammar", inner, ("<|a|>", "<|/a|>"), opened=False)
    assert grammar_text("grammar", grammar) == grammar
    assert _accepts(ll_tokenizer, tiny_tokenizer, grammar, "<|a|>x|y<|/a|>why[/r]ok")
    assert _accepts(ll_tokenizer, tiny_tokenizer, grammar, "why[/r]\nok")
    assert not _accepts(ll_tokenizer, tiny_tokenizer, grammar, "<|a|>x<|/a|>ok")


@given(st.text(alphabet=st.sampled_from("a/\\\n\r\t[]()|.*+?{}^$ é#&~-"), max_size=12))
def test_regex_escaping_is_llguidances(regex: str) -> None:
    assert reasoning_module._lark_regex(regex) == llguidance.regex_to_lark(regex, "")


def test_after_thought_refuses_what_is_not_a_constraint() -> None:
    with pytest.raises(ValueError, match="unknown"):
        after_thought("jsonschema", {}, THINK_TAGS, opened=True)
    with pytest.raises(ValueError, match="choice"):
        after_thought("choice", "red", THINK_TAGS, opened=True)


# -- the thinking budget, token by token ----------------------------------------------------


def _budget(tokenizer, budget: int = 3, batch: int = 1, **tags: str) -> ThinkingBudget:
    ctx = make_context(vocab_size=VOCAB_SIZE, batch_size=batch, tokenizer=tokenizer)
    return ThinkingBudget(budget, ctx=ctx, **tags)


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _prompt(tokenizer, *texts: str) -> np.ndarray:
    """Left-padded prompt rows, as the loop's first call sees them."""
    rows = [_ids(tokenizer, t) for t in texts]
    width = max(map(len, rows))
    return np.asarray([[0] * (width - len(r)) + r for r in rows], dtype=np.int64)


def _feed(processor: ThinkingBudget, tokenizer, text: str, row: int = 0, rows: int = 1) -> None:
    for token in _ids(tokenizer, text):
        processor.advance([[token] if r == row else [] for r in range(rows)])


def test_the_budget_forces_the_close_tag_after_budget_thought_tokens(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    close = _ids(tok, "</think>")
    processor = _budget(tok, budget=3, batch=2)
    scores = np.random.default_rng(0).standard_normal((2, VOCAB_SIZE)).astype(np.float32)
    prompt = _prompt(tok, "user\nHi\nassistant\n<think>\n", "Hi <think>a</think>\n")
    out = check_logits_processor(processor, prompt, scores)
    assert out is scores  # the scores are left alone
    assert [processor.forced_tokens(r) for r in (0, 1)] == [[], []]
    _feed(processor, tok, "ab", row=0, rows=2)
    assert processor.forced_tokens(0) == []
    _feed(processor, tok, "c", row=0, rows=2)
    assert processor.forced_tokens(0) == close  # three thought tokens: the budget
    assert processor.forced_tokens(1) == []  # row 1's prompt closed its thought
    _feed(processor, tok, "</think>", row=0, rows=2)
    assert processor.forced_tokens(0) == []
    _feed(processor, tok, "x<think>yz", row=1, rows=2)  # a thought the row opens itself
    assert processor.forced_tokens(1) == []
    _feed(processor, tok, "w", row=1, rows=2)
    assert processor.forced_tokens(1) == close


def test_tags_spelled_in_several_tokens_and_a_multi_token_close(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    processor = _budget(tok, budget=2, open="<r>", close="</r>")
    processor(_prompt(tok, "say <r"), np.zeros((1, VOCAB_SIZE), np.float32))
    _feed(processor, tok, ">a")  # the prompt's "<r" and this ">" open a thought
    assert processor.forced_tokens(0) == []
    _feed(processor, tok, "<")
    assert processor.forced_tokens(0) == _ids(tok, "</r>")  # four tokens, forced together
    _feed(processor, tok, "</r>")
    assert processor.forced_tokens(0) == []


def test_rewind_reorder_fork_and_drafts_keep_the_budget_in_step(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    close = _ids(tok, "</think>")
    processor = _budget(tok, budget=3, batch=2)
    processor(_prompt(tok, "<think>", "no thought"), np.zeros((2, VOCAB_SIZE), np.float32))
    _feed(processor, tok, "abc", row=0, rows=2)
    assert processor.forced_tokens(0) == close
    processor.rewind([2, 0])
    assert processor.forced_tokens(0) == []
    assert processor.valid_prefix(0, _ids(tok, "xyz")) == 2  # the third would pass the budget
    assert processor.valid_prefix(1, _ids(tok, "xyz")) == 3
    twin = processor.fork()
    _feed(twin, tok, "bc", row=0, rows=2)
    assert twin.forced_tokens(0) == close and processor.forced_tokens(0) == []
    twin.reorder(np.array([0, 0]))  # beams: both rows copies of row 0, independent
    assert twin.forced_tokens(1) == close
    twin.rewind([0, 1])
    assert twin.forced_tokens(0) == close and twin.forced_tokens(1) == []
    with pytest.raises(ValueError, match="cannot rewind"):
        processor.rewind([5, 0])


def test_the_budget_passes_candidates_through(tiny_tokenizer) -> None:
    ids = _prompt(tiny_tokenizer, "<think>", "x")
    scores = np.random.default_rng(1).standard_normal((2, VOCAB_SIZE)).astype(np.float32)
    out = check_sparse(_budget(tiny_tokenizer, batch=2), ids, scores)
    assert out is not None


def test_the_budget_needs_a_tokenizer_and_a_positive_budget(tiny_tokenizer) -> None:
    with pytest.raises(ConfigError, match="thinking_budget needs the model's tokenizer"):
        ThinkingBudget(4, ctx=make_context(vocab_size=VOCAB_SIZE))
    with pytest.raises(ConfigError, match="thinking_budget"):
        _budget(tiny_tokenizer, budget=0)
    with pytest.raises(ConfigError, match="close tag"):
        _budget(tiny_tokenizer, close=" </think>")
    from ortgen.config import resolve

    with pytest.raises(ConfigError, match="thinking_budget must be > 0"):
        resolve([("call", {"thinking_budget": 0})])


def test_the_budget_comes_before_the_grammar() -> None:
    from ortgen.config import resolve

    grammar = after_thought("json_object", True, THINK_TAGS, opened=True)
    config = resolve([("call", {"thinking_budget": 7, "grammar": grammar})]).config
    names = [name for name, _ in processor_specs(config)]
    assert names == ["thinking_budget", "grammar"]
    assert processor_specs(config)[0][1] == {"budget": 7}


# -- on a tiny Qwen3-style model -------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3_like(tiny_root: Path):
    folder = export_chat_family(tiny_root, "think-qwen3", QWEN3_LIKE, special_tokens=SPECIALS)
    return ortgen.load(folder, threads=1)


def _thought_length(tokens: list[int], close: int) -> int | None:
    return tokens.index(close) if close in tokens else None


def test_a_thought_ends_at_the_budget(qwen3_like) -> None:
    gen = qwen3_like
    close = gen.tokenizer.token_to_id("</think>")
    rows = [{"messages": MESSAGES, "seed": seed} for seed in range(12)]
    # min_new_tokens: no end of sequence before the budget could force the tag
    out = gen.generate(
        rows, thinking_budget=16, do_sample=True, max_new_tokens=24, min_new_tokens=17
    )
    lengths = [_thought_length(tokens, close) for tokens in out.tokens]
    assert all(n is not None and n <= 16 for n in lengths), lengths
    assert 16 in lengths  # the random model does not close its thoughts itself
    for text in out.text:
        reasoning, _ = split_reasoning(text, THINK_TAGS, opened=True)
        assert reasoning is not None and "</think>" not in reasoning


def test_free_to_think_strict_to_answer_with_a_budget(qwen3_like) -> None:
    gen = qwen3_like
    close = gen.tokenizer.token_to_id("</think>")
    grammar = after_thought("json_schema", SCHEMA, THINK_TAGS, opened=True)
    rows = [{"messages": MESSAGES, "seed": seed} for seed in range(50)]
    out = gen.generate(rows, grammar=grammar, thinking_budget=16, do_sample=True, max_new_tokens=64)
    assert out.finish_reasons == ["eos"] * 50, out.finish_reasons
    for tokens, text in zip(out.tokens, out.text, strict=True):
        assert (_thought_length(tokens, close) or 0) <= 16, text
        reasoning, answer = split_reasoning(text, THINK_TAGS, opened=True)
        assert reasoning is not None
        jsonschema.validate(json.loads(answer), SCHEMA)


def test_a_multi_token_close_tag_is_forced_under_its_grammar(qwen3_like) -> None:
    """Tags the tokenizer spells in characters: the budget forces four tokens, which the
    grammar's thought allows at any point."""
    tags = ("<r>", "</r>")
    grammar = after_thought("choice", ["yes", "no"], tags, opened=True)
    budget = {"name": "thinking_budget", "budget": 5, "open": tags[0], "close": tags[1]}
    prompts = [{"prompt": "Think: <r>\n", "seed": seed} for seed in range(10)]
    out = qwen3_like.generate(
        prompts, grammar=grammar, logits_processors=[budget], do_sample=True, max_new_tokens=30
    )
    close = qwen3_like.tokenizer.encode(tags[1], add_special_tokens=False)
    assert len(close) == 4
    for tokens, text in zip(out.tokens, out.text, strict=True):
        _, answer = split_reasoning(text, tags, opened=True)
        assert answer in ("yes", "no"), text
        starts = [i for i in range(len(tokens)) if tokens[i : i + 4] == close]
        assert starts and starts[0] <= 5, text


def test_drafts_and_a_fork_follow_the_budget(qwen3_like) -> None:
    """Speculative decoding gives the tokens decoding without drafts gives, and a fork
    taken mid-thought goes on as the original does (the budget's state is copied)."""
    # chat() applies the schema after the thought itself (build_chat: after_thought); a
    # step object built from messages rows takes the grammar as given
    grammar = after_thought("json_schema", SCHEMA, THINK_TAGS, opened=True)
    common = {"thinking_budget": 8, "do_sample": True, "max_new_tokens": 60}
    settings = {"grammar": grammar, **common}
    for seed in range(4):
        plain = qwen3_like.chat(MESSAGES, seed=seed, json_schema=SCHEMA, **common)
        drafted = qwen3_like.chat(
            MESSAGES, seed=seed, json_schema=SCHEMA, prompt_lookup_num_tokens=3, **common
        )
        assert drafted.tokens == plain.tokens
        state = qwen3_like.start([{"messages": MESSAGES}], seed=seed, **settings)
        for _ in range(4):
            state.step()
        twin = state.fork()
        for run in (state, twin):
            while not run.is_done:
                run.step()
        assert twin.generated(0) == state.generated(0) == plain.tokens[0]
