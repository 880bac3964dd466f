"""Structured output: the ``grammar`` processor on llguidance, in the loop.

On tiny random-weight models with a character tokenizer (every output is whatever the
weights make of it, so only the grammar keeps it in shape) and on both graph families:
outputs match their constraint (answers cut by the limit are prefixes of it), every mask
along hot generations is llguidance's whole allowed set, sparse or dense, forced tokens
give the same tokens fed together or one by one, batches keep unconstrained rows free of
any mask, beams, rewinds and forks keep the grammar in step, and every bad input is named
before a forward. The reference is llguidance itself, built apart from the processor
(``tests/grammar_reference.py``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import ortgen
from ortgen import Candidates
from ortgen.errors import ConfigError, NoTokenLeft
from ortgen.plugins.grammar import GrammarConstraint
from tests.grammar_reference import Reference, reference_tokenizer
from tests.tiny_models import EOS_ID, VOCAB_SIZE, export_tiny

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
#: the tiny tokenizer's special tokens other than EOS: never text, so never in a grammar
NOT_TEXT = [[0], [1], [3]]


@pytest.fixture(scope="module", params=["fused", "optimum"])
def gen(request, tiny_root: Path):
    folder = export_tiny(
        "llama", tiny_root / f"grammar-{request.param}", with_tokenizer=True, graph=request.param
    )
    return ortgen.load(folder, threads=1)


@pytest.fixture(scope="module")
def ll_tokenizer(gen):
    """llguidance's tokenizer for the tiny vocabulary, built apart from ortgen's."""
    return reference_tokenizer(gen.tokenizer, VOCAB_SIZE, (EOS_ID,))


def _reference(ll_tokenizer, setting: str, value) -> Reference:
    return Reference(ll_tokenizer, setting, value, VOCAB_SIZE, (EOS_ID,))


def _valid(schema: dict, text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def test_a_schema_is_followed_greedy_and_sampled(gen) -> None:
    for seed in (None, 1, 2, 3):
        sampling = {"do_sample": True, "temperature": 0.9, "seed": seed} if seed else {}
        out = gen.generate("Hi", json_schema=PERSON, max_new_tokens=80, **sampling)
        assert out.finish_reasons == ["eos"], (seed, out.text)
        assert _valid(PERSON, out.text), (seed, out.text)
        assert out.parsed == json.loads(out.text) and out.parse_errors is None
        assert out.tokens[0][-1] == 2  # the end of sequence the finished grammar asked for


@pytest.mark.parametrize(
    ("setting", "check"),
    [
        ({"regex": r"[0-9]{3}-[a-c]+"}, lambda t: re.fullmatch(r"[0-9]{3}-[a-c]+", t)),
        ({"choice": ["red", "green", "blue sky"]}, lambda t: t in ("red", "green", "blue sky")),
        ({"json_object": True}, lambda t: isinstance(json.loads(t), dict)),
        (
            {"grammar": 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,2}/'},
            lambda t: re.fullmatch(r"\(\d{1,2}(,\d{1,2})*\)", t),
        ),
    ],
)
def test_every_kind_of_constraint(gen, ll_tokenizer, setting, check) -> None:
    """Whole answers match their constraint; one cut by the limit (a regex like [a-c]+
    may run on) is a prefix llguidance accepts token by token."""
    reference = _reference(ll_tokenizer, *next(iter(setting.items())))
    for seed in (4, 5, 6):
        out = gen.generate("Go", max_new_tokens=60, do_sample=True, seed=seed, **setting)
        if reference.check_answer(out.tokens[0], out.finish_reasons[0], 60):
            assert check(out.text), out.text
        else:
            assert "regex" in setting, out.text


def test_a_grammar_that_admits_any_text_changes_nothing(gen) -> None:
    """Greedy under a grammar that allows every text is the unconstrained greedy output
    (the tiny tokenizer's other special tokens are banned in both: they are not text)."""
    settings = {"max_new_tokens": 30, "bad_words_ids": NOT_TEXT}
    for prompt in ("Hello", "abc", "1, 2, 3"):
        free = gen.generate(prompt, **settings)
        anything = gen.generate(prompt, regex=r"[\s\S]*", **settings)
        assert anything.tokens == free.tokens, prompt


def test_forced_tokens_fed_together_equal_one_by_one(gen) -> None:
    """Alone, the tokens a schema forces cost no forward of their own (they are fed with
    the next sampled one); beside a free row every step runs a forward. The constrained
    row's tokens and random draws are the same either way, and the free row sees no mask."""
    constrained = {"prompt": "Hi", "json_schema": PERSON, "seed": 9}
    free = {"prompt": "The sea", "seed": 10}
    settings = {"max_new_tokens": 50, "do_sample": True, "temperature": 0.8}
    alone = gen.generate([constrained], **settings)
    assert alone.stats["fast_forward_tokens"] >= 10  # '{"name":"', '","age":' ...
    free_alone = gen.generate([free], **settings)
    together = gen.generate([constrained, free], **settings)
    assert together.tokens[0] == alone.tokens[0]
    assert together.tokens[1] == free_alone.tokens[0]
    assert (
        "fast_forward_tokens" not in together.stats
        or together.stats["fast_forward_tokens"] < alone.stats["fast_forward_tokens"]
    )
    greedy = gen.generate("Hi", json_schema=PERSON, max_new_tokens=50)
    one_by_one = gen.generate(["Hi", "The sea"], json_schema=PERSON, max_new_tokens=50)
    assert one_by_one.tokens[0] == greedy.tokens[0]


def test_rows_with_different_constraints_and_none(gen, ll_tokenizer) -> None:
    rows = [
        {"prompt": "a", "regex": r"x+y"},
        {"prompt": "b"},
        {"prompt": "c", "choice": ["one", "two"]},
        {"prompt": "d", "json_schema": PERSON},
    ]
    settings = {"max_new_tokens": 40, "do_sample": True, "seed": 3, "bad_words_ids": NOT_TEXT}
    out = gen.generate(rows, **settings)
    for row in range(len(rows)):
        alone = gen.generate([rows[row]], **settings)
        assert out.tokens[row] == alone.tokens[0], row
    regex = _reference(ll_tokenizer, "regex", r"x+y")
    if regex.check_answer(out.tokens[0], out.finish_reasons[0], 40):
        assert re.fullmatch(r"x+y", out.text[0]), out.text[0]
    assert out.text[2] in ("one", "two")
    assert _valid(PERSON, out.text[3])
    assert out.parsed[:3] == [None, None, None] and out.parsed[3] == json.loads(out.text[3])


def test_beam_search_with_a_schema(gen) -> None:
    out = gen.generate("Hi", json_schema=PERSON, num_beams=3, num_return_sequences=2,
                       max_new_tokens=60)  # fmt: skip
    for text, reason in zip(out.text, out.finish_reasons, strict=True):
        assert reason == "eos" and _valid(PERSON, text), text


def test_rewind_and_fork_keep_the_grammar_in_step(gen) -> None:
    state = gen.start("Hi", json_schema=PERSON, max_new_tokens=60)
    for _ in range(6):
        state.step()
    before = state.generated(0)
    twin = state.fork()
    state.rewind(3)  # the grammar forgets the last three tokens with the buffer
    while not state.is_done:
        state.step()
    while not twin.is_done:
        twin.step()
    assert state.generated(0) == twin.generated(0)  # greedy: the same road again
    assert state.generated(0)[: len(before)] == before
    assert _valid(PERSON, state.text(0))


def test_output_cut_by_the_limit_says_why(gen, ll_tokenizer) -> None:
    """An answer cut by the limit is not parsed, and says why; its text is still a
    prefix of the schema (llguidance takes every token of it)."""
    reference = _reference(ll_tokenizer, "json_schema", PERSON)
    for settings in ({}, {"do_sample": True, "temperature": 3.0, "seed": 7}):
        out = gen.generate("Hi", json_schema=PERSON, max_new_tokens=12, **settings)
        assert not reference.check_answer(out.tokens[0], out.finish_reasons[0], 12)
        assert out.text.startswith('{"name":"'), out.text  # past the forced opening
        assert out.parsed is None and "max_new_tokens" in out.parse_errors


def test_bad_constraints_are_named_before_any_forward(gen, monkeypatch) -> None:
    def no_forward(*args, **kwargs):
        raise AssertionError("a forward ran")

    monkeypatch.setattr("ortgen.model.session.ForwardBinding.forward", no_forward)
    cases = [
        (
            {"json_schema": {"type": "object", "unevaluatedProperties": False}},
            "unevaluatedProperties",
        ),
        ({"regex": "(ab"}, "unclosed group"),
        ({"grammar": "start: ("}, "Lark grammar"),
        ({"regex": "a", "choice": ["b"]}, "regex and choice"),
        ({"json_schema": "/no/such/schema.json"}, "no file"),
        ({"json_schema": "[1, 2]"}, "holds a list"),
        ({"choice": []}, "non-empty list"),
        ({"json_schema": {"type": "object"}, "eos_token_id": None}, "eos_token_id"),
    ]
    for settings, named in cases:
        with pytest.raises(ConfigError) as error:
            gen.generate("Hi", **settings)
        assert named in str(error.value), (settings, str(error.value))


def test_a_row_whose_grammar_allows_nothing_fails_with_its_reason(gen) -> None:
    """A processor before the grammar removed the only token it allows ("{" is a bad
    word): the request fails naming that processor."""
    brace = gen.tokenizer.encode("{", add_special_tokens=False)
    with pytest.raises(NoTokenLeft) as caught:
        gen.generate("Hi", json_object=True, bad_words_ids=[brace], fast_forward=False)
    assert str(caught.value) == (
        "logits processor 'grammar': row 0: bad_words_ids (before the grammar) removed every "
        "token the grammar allows here: loosen or drop bad_words_ids"
    )
    assert caught.value.allowed == brace


def _not_first(gen, letters: str) -> list[str]:
    """Letters the greedy first token after "Hi" is not (the weights are random)."""
    first = gen.tokenizer.decode(gen.generate("Hi", max_new_tokens=1).tokens[0])
    return [c for c in letters if c != first]


def test_a_cut_before_the_grammar_is_named_with_what_to_do(gen) -> None:
    """top_k given in logits_processors runs before the grammar and keeps one token the
    grammar does not allow: the error names top_k (found only when the step fails) and
    says where it belongs; as the top_k setting it runs after the grammar and generates.
    Two processors that each removed some of the allowed tokens are both named."""
    a, b = _not_first(gen, "abc")[:2]
    cut = [{"name": "top_k", "top_k": 1}]
    with pytest.raises(NoTokenLeft) as caught:
        gen.generate("Hi", regex=f"{a}+", logits_processors=cut, fast_forward=False)
    assert str(caught.value) == (
        "logits processor 'grammar': row 0: top_k (before the grammar) removed every token "
        "the grammar allows here: put top_k after the grammar (the top_k setting runs after "
        "it; logits_processors run before it) or drop it"
    )
    out = gen.generate("Hi", regex=f"{a}+", top_k=1, do_sample=True, max_new_tokens=3)
    assert re.fullmatch(f"{a}+", out.text)
    suppressed = gen.tokenizer.encode(a, add_special_tokens=False)
    with pytest.raises(NoTokenLeft) as caught:
        gen.generate(
            "Hi", regex=f"[{a}{b}]+", logits_processors=cut, suppress_tokens=suppressed,
            fast_forward=False,
        )  # fmt: skip
    assert str(caught.value).startswith(
        "logits processor 'grammar': row 0: suppress_tokens and top_k (before the grammar) "
        "removed every token the grammar allows here: put top_k after the grammar"
    )
    assert str(caught.value).endswith("; loosen or drop suppress_tokens")


def test_a_culprit_is_looked_for_only_when_a_step_fails(gen, monkeypatch) -> None:
    """The normal step runs each processor once (nothing kept or run again for blame)."""
    from ortgen.loop import scoring

    calls = []
    monkeypatch.setattr(scoring, "blame", lambda *a: calls.append(a) or a[0])
    out = gen.generate("Hi", json_object=True, max_new_tokens=8, top_k=3, do_sample=True)
    assert out.tokens and calls == []


@pytest.mark.parametrize("choice", ["é", "aé", "\x1f"])
@pytest.mark.parametrize("fast_forward", [True, False])
def test_text_the_vocabulary_cannot_spell_is_no_token_left(gen, choice, fast_forward) -> None:
    """The tiny character vocabulary has no 'é' and no byte fallback: llguidance allows
    (or forces) the unknown token for it and then refuses it. The grammar drops it, and
    the row is left with nothing: NoTokenLeft (an InputError: the request asked for it),
    not a component crash; the text each row of the batch produced is kept."""
    unknown = gen.tokenizer.encode("é", add_special_tokens=False)
    assert len(unknown) == 1 and unknown[0] in gen.tokenizer.special_ids  # <unk>
    with pytest.raises(NoTokenLeft, match="vocabulary cannot spell"):
        gen.generate("Hi", choice=[choice], fast_forward=fast_forward, max_new_tokens=4)
    prompts = [{"prompt": "Hi", "choice": ["ab"]}, {"prompt": "Hi", "choice": [choice]}]
    with pytest.raises(NoTokenLeft) as caught:
        gen.generate(prompts, max_new_tokens=4, fast_forward=fast_forward)
    kept = caught.value.partial.text  # what each row produced up to the failure is kept
    assert kept[1] == choice[:-1] and "ab".startswith(kept[0])
    assert len(kept[0]) >= len(kept[1])  # the other row went as far


def test_a_model_without_a_tokenizer_cannot_be_constrained(tiny_llama_gen) -> None:
    with pytest.raises(ConfigError, match="needs the model's tokenizer"):
        tiny_llama_gen.generate([[1, 2, 3]], json_object=True, max_new_tokens=4)


def test_the_mask_keeps_only_allowed_tokens_dense_and_sparse(gen) -> None:
    """The processor on its own (as a plugin author would call it): few allowed tokens
    come back as Candidates, many as a dense row; both equal a mask built by hand from
    llguidance's own matcher."""
    import llguidance.numpy

    from ortgen.testing import make_context

    ctx = make_context(vocab_size=256, eos_token_ids=(2,))
    ctx = ctx.__class__(**{**ctx.__dict__, "tokenizer": gen.tokenizer})
    from ortgen.plugins.grammar import GrammarConstraint

    for setting in ({"json_object": True}, {"regex": r"[\s\S]*"}):
        processor = GrammarConstraint(ctx=ctx, **setting)
        scores = np.random.default_rng(0).normal(size=(1, 256)).astype(np.float32)
        reference = processor.matchers[0].deep_copy()
        bits = np.zeros((1, 8), np.int32)
        llguidance.numpy.fill_next_token_bitmask(reference, bits, 0)
        allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:256].astype(bool)
        expected = np.where(allowed, scores, -np.inf)
        sparse = processor.sparse(np.zeros((1, 1), np.int64), scores)
        got = processor(np.zeros((1, 1), np.int64), scores) if sparse is None else sparse.dense()
        np.testing.assert_array_equal(got, expected)
        assert (sparse is None) == ("regex" in setting)


class MaskCheck:
    """Every mask the loop asks the ``grammar`` processor for, held to llguidance's own.

    Wraps ``GrammarConstraint.sparse`` and ``__call__`` on the class, so the processors
    the loop builds are the ones checked, on the loop's own path (masks computed beside
    the forward, batches, finished rows). At each call the tokens every row generated so
    far are read from ``input_ids`` (after the prompts' padded width), a fresh reference
    matcher walks them, and the tokens the processor leaves finite must be exactly those
    llguidance allows next, the whole set, with their scores untouched. Differences are
    kept rather than raised, so a loop that goes on to fail still shows them.
    """

    def __init__(self, monkeypatch, reference: Reference, prompts: list[list[int]]) -> None:
        self.reference, self.prompts = reference, prompts
        self.width = max(len(p) for p in prompts)  # the loop pads prompts on the left
        self.differences: list[str] = []
        self.paths: Counter[str] = Counter()
        sparse, dense = GrammarConstraint.sparse, GrammarConstraint.__call__

        def checked_sparse(processor, input_ids, scores):
            out = sparse(processor, input_ids, scores)
            if out is not None:
                self._check("sparse", input_ids, scores, out.dense())
            return out

        def checked_dense(processor, input_ids, scores):
            out = dense(processor, input_ids, scores)
            self._check("dense", input_ids, scores, out)
            return out

        monkeypatch.setattr(GrammarConstraint, "sparse", checked_sparse)
        monkeypatch.setattr(GrammarConstraint, "__call__", checked_dense)

    def _check(self, path: str, input_ids: np.ndarray, scores, out: np.ndarray) -> None:
        given = scores.dense() if isinstance(scores, Candidates) else np.asarray(scores)
        for row, prompt in enumerate(self.prompts):
            if input_ids[row, self.width - len(prompt) : self.width].tolist() != prompt:
                self.differences.append(f"row {row}: not the prompt {prompt}: {input_ids[row]}")
                continue
            made = input_ids[row, self.width :].tolist()
            if EOS_ID in made:  # a finished row: the end of sequence, then padding
                made = made[: made.index(EOS_ID) + 1]
            matcher, done = self.reference.walk(made)
            if done < len(made):
                self.differences.append(f"row {row}: {made} leaves the grammar at {done}")
                continue
            expected = self.reference.allowed(matcher) & (given[row] != -np.inf)
            kept = out[row] != -np.inf
            if not np.array_equal(kept, expected):
                self.differences.append(
                    f"{path} mask after {made}: allows {np.flatnonzero(kept & ~expected)} "
                    f"that llguidance refuses, drops {np.flatnonzero(expected & ~kept)} "
                    "that it allows"
                )
            elif not np.array_equal(out[row, kept], given[row, kept]):
                self.differences.append(f"{path} mask after {made}: allowed scores changed")
            self.paths[path] += 1


#: constraints whose every mask is checked: free text inside a JSON string and a run of
#: printable characters or words take the dense path (most of the 256 tokens allowed);
#: keys, numbers, choices and punctuation the sparse one (at most 1/16 allowed)
NOTE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "note": {"type": "string"},
    },
    "required": ["name", "age", "tags", "note"],
    "additionalProperties": False,
}
MASKED = {
    "schema": ("json_schema", NOTE, {"sparse", "dense"}),
    "regex": ("regex", r"[0-9]{2}:[ -~]{1,30};", {"sparse", "dense"}),
    "choice": ("choice", ["red", "green", "blue sky"], {"sparse"}),
    "lark": (
        "grammar",
        'start: "(" NUM ("," NUM)* ") " WORDS "."\nNUM: /[0-9]{1,2}/\nWORDS: /[a-z ]{1,20}/',
        {"sparse", "dense"},
    ),
}


@pytest.mark.parametrize("case", sorted(MASKED))
def test_every_mask_along_hot_generations_is_llguidances(
    gen, ll_tokenizer, monkeypatch, case
) -> None:
    """Hot sampling (temperature 4: nearly every allowed token is likely) wanders through
    many states of the grammar; at each one the processor's mask, sparse or dense, is
    llguidance's whole allowed set (``MaskCheck``), with and without forced tokens, and
    every answer stays inside the grammar. The first mask alone, or a sample of its
    tokens, misses a dense mask that also allows the end of sequence and a sparse one
    that drops a token."""
    setting, value, paths = MASKED[case]
    prompts = ["Hi", "Tell me"]
    encoded = [gen.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    check = MaskCheck(monkeypatch, _reference(ll_tokenizer, setting, value), encoded)
    for seed in (1, 2, 3, 4):
        try:
            out = gen.generate(prompts, **{setting: value}, do_sample=True, temperature=4.0,
                               seed=seed, max_new_tokens=64, fast_forward=seed > 2)  # fmt: skip
        finally:
            assert not check.differences, check.differences[:3]
        for tokens, reason in zip(out.tokens, out.finish_reasons, strict=True):
            check.reference.check_answer(tokens, reason, 64)
    print(case, "masks checked:", dict(check.paths))
    assert set(check.paths) == paths and min(check.paths.values()) >= 10, check.paths


def test_hot_sampling_inside_a_free_text_string(gen, ll_tokenizer) -> None:
    """Regression (issue 36): sampling at temperature 50 (near uniform) inside a JSON
    string, where the dense mask allows ~250 of the 256 tokens. A dense mask that also
    let the end of sequence through passed every other test of its time; here some row
    draws it inside the string within a few hundred tokens, and the request failed with
    ``grammar failed in advance()``. Whole answers validate, cut ones are prefixes."""
    schema = {"type": "object", "properties": {"text": {"type": "string"}},
              "required": ["text"], "additionalProperties": False}  # fmt: skip
    reference = _reference(ll_tokenizer, "json_schema", schema)
    reasons: Counter[str] = Counter()
    for seed in range(10):
        out = gen.generate(["Hi", "Say", "Once", "Tell"], json_schema=schema, do_sample=True,
                           temperature=50.0, seed=seed, max_new_tokens=60)  # fmt: skip
        for tokens, text, reason in zip(out.tokens, out.text, out.finish_reasons, strict=True):
            reasons[reason] += 1
            if reference.check_answer(tokens, reason, 60):
                assert _valid(schema, text), text
    assert reasons["length"] >= 20, reasons  # most rows stayed inside the string


def test_the_latest_layer_that_sets_a_constraint_decides(gen) -> None:
    """A call's regex replaces a pipeline's schema; a row's choice replaces its call's
    regex; two constraints in one layer are named."""
    pipeline = {"json_schema": PERSON}
    out = gen.generate("Hi", pipeline=pipeline, regex="[a-c]{3}", max_new_tokens=10)
    assert re.fullmatch("[a-c]{3}", out.text) and out.parsed is None
    rows = gen.generate([{"prompt": "Hi", "choice": ["yes", "no"]}, "Ho"], regex="z+y",
                        max_new_tokens=10)  # fmt: skip
    assert rows.text[0] in ("yes", "no") and re.fullmatch("z+y", rows.text[1])
    with pytest.raises(ConfigError, match="regex and choice are set together"):
        gen.generate("Hi", regex="a", choice=["b"])


class Drafts:
    """Drafts a fixed token list after the prompt, whatever was generated."""

    def __init__(self, tokens: list[int], prompt_length: int) -> None:
        self.tokens, self.prompt_length = tokens, prompt_length

    def draft(self, tokens, limit):
        done = len(tokens) - self.prompt_length
        return self.tokens[done : done + limit]


class DraftsPlugin:
    @ortgen.hookimpl
    def register_drafters(self, register):
        register("fixed", Drafts)


def test_drafts_the_grammar_refuses_are_not_verified(gen) -> None:
    """A draft is cut at the first token the grammar would refuse (ChecksDrafts): the
    verifying forward feeds only what the model may pick, and the output is the output
    without drafts."""
    gen = ortgen.load(gen.path, threads=1, plugins=[DraftsPlugin()])
    prompt = gen.tokenizer.encode("Hi")
    settings = {"regex": "[ab]{12}", "max_new_tokens": 20, "do_sample": False}
    plain = gen.generate(prompt, **settings)
    a, z = (gen.tokenizer.encode(c, add_special_tokens=False)[0] for c in "az")
    # drafts start after the first generated token: 'a', then only 'z's, which leave the
    # grammar; unchecked, every step would feed up to 11 of them
    script = [z, a] + [z] * 18
    spec = {"name": "fixed", "tokens": script, "prompt_length": len(prompt)}
    fast = gen.generate(prompt, **settings, drafter=spec)
    assert fast.tokens == plain.tokens
    assert fast.stats["drafted"] == 1 and fast.stats["verify_forwards"] == 1
