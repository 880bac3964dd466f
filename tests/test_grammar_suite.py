"""The grammar against the JSON Schema Test Suite (draft 2020-12) and at random.

Every instance of the official suite is fed, as compact JSON tokens of the default model's
tokenizer, through the very grammar ortgen compiles for ``json_schema``: it must never
accept an invalid instance. Valid instances it rejects and schemas llguidance refuses are
counted and must not grow (llguidance keeps properties in declared order, checks
``format``, and does not implement ``unevaluated*``, ``if``/``then``, ``not``, ...; see
docs/structured.md). Then a property test walks random grammar states with random logits:
at every state the processor keeps exactly the tokens a separate llguidance matcher
allows, so the sampled token is always one the grammar allows.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ortgen import ConfigError
from ortgen.plugins.grammar_compile import check_grammar, grammar_text, shared_tokenizer
from ortgen.text import load_tokenizer
from tests.grammar_reference import Reference, reference_tokenizer
from tests.schema_corpus import load_schemas, suite_cases

#: what llguidance 1.9 does with the suite today (compact JSON, ensure_ascii=False); the
#: test fails if these grow, so a regression or a new refusal is seen
MAX_FALSE_REJECTS = 22
MAX_REFUSED_GROUPS = 204


_STATE: dict = {}  # the model state the property test's processors share


@pytest.fixture(scope="module")
def text_tokenizer(default_model_dir):
    return load_tokenizer(default_model_dir)


@pytest.fixture(scope="module")
def ll_reference_tokenizer(text_tokenizer):
    """llguidance's tokenizer built apart from ortgen's (the reference matcher's)."""
    return reference_tokenizer(text_tokenizer, 49152, (2,))


@pytest.fixture(scope="module")
def tokenizer(text_tokenizer):
    """The default model's tokenizer as llguidance sees it (EOS 2, as SmolLM2 ends turns)."""
    return shared_tokenizer(_STATE, text_tokenizer, 49152, (2,))


def _matcher(tokenizer, schema):
    """A fresh matcher for ``schema`` through ortgen's own compile path, or None when
    it is refused (as ``generate(json_schema=...)`` would refuse it)."""
    import llguidance

    from ortgen.structured.settings import normalise

    try:
        grammar = grammar_text("json_schema", normalise("json_schema", schema))
        check_grammar("json_schema", grammar, tokenizer)
    except (ConfigError, TypeError, ValueError):
        return None
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    return None if matcher.is_error() else matcher


def _accepts(matcher, tokenizer, instance) -> bool:
    text = json.dumps(instance, separators=(",", ":"), ensure_ascii=False)
    ids = tokenizer.tokenize_str(text)
    return matcher.validate_tokens(ids) == len(ids) and (
        matcher.consume_tokens(ids) and matcher.is_accepting()
    )


def test_the_json_schema_test_suite_never_accepts_an_invalid_instance(tokenizer) -> None:
    counts: Counter[str] = Counter()
    false_accepts = []
    refused: set[tuple[str, str]] = set()
    compiled: dict[tuple[str, str], object] = {}
    for file, group, schema, description, instance, valid in suite_cases():
        key = (file, group)
        if key not in compiled and key not in refused:
            matcher = _matcher(tokenizer, schema)
            if matcher is None:
                refused.add(key)
            else:
                compiled[key] = matcher
        if key in refused:
            counts["refused instances"] += 1
            continue
        accepted = _accepts(compiled[key].deep_copy(), tokenizer, instance)
        counts[f"{'valid' if valid else 'invalid'} {'accepted' if accepted else 'rejected'}"] += 1
        if accepted and not valid:
            false_accepts.append((file, group, description, instance))
    print(dict(counts), "refused groups:", len(refused), "compiled groups:", len(compiled))
    assert not false_accepts, false_accepts[:5]
    assert counts["valid rejected"] <= MAX_FALSE_REJECTS, counts
    assert len(refused) <= MAX_REFUSED_GROUPS, len(refused)
    assert counts["valid accepted"] >= 300 and counts["invalid rejected"] >= 230, counts


def test_every_corpus_example_is_accepted(tokenizer) -> None:
    """The in-repo schemas (tests/data/schemas) compile, and each file's example fits."""
    schemas = load_schemas()
    assert len(schemas) >= 30
    for name, entry in schemas:
        matcher = _matcher(tokenizer, entry["schema"])
        assert matcher is not None, name
        assert _accepts(matcher, tokenizer, entry["example"]), name


@settings(max_examples=40, deadline=None)
@given(
    schema_index=st.integers(min_value=0, max_value=40),
    seed=st.integers(min_value=0, max_value=2**31 - 1),
    scale=st.sampled_from([0.1, 1.0, 5.0, 30.0]),
    greedy=st.booleans(),
)
def test_the_sampled_token_is_always_allowed(
    text_tokenizer, ll_reference_tokenizer, schema_index, seed, scale, greedy
) -> None:
    """Random logits at random grammar states: after the processor, the tokens left
    finite are exactly those a separate llguidance matcher (following the same picks)
    allows, the whole set of the 49,152, with their scores unchanged; so whatever a
    sampler picks is allowed, and walking on with it keeps both matchers out of error.
    (The full set costs about what the 5-token sample it replaced did: one bitmask of
    the reference per state; only tokens the processor dropped are checked one by one.)"""
    from ortgen.plugins.grammar import GrammarConstraint
    from ortgen.testing import make_context

    schemas = load_schemas()
    _, entry = schemas[schema_index % len(schemas)]
    ctx = make_context(vocab_size=49152, eos_token_ids=(2,))
    ctx = ctx.__class__(**{**ctx.__dict__, "tokenizer": text_tokenizer, "model_state": _STATE})
    processor = GrammarConstraint(ctx=ctx, json_schema=entry["schema"])
    reference = Reference(ll_reference_tokenizer, "json_schema", entry["schema"], 49152, (2,))
    matcher = reference.start.deep_copy()
    rng = np.random.default_rng(seed)
    ids = np.zeros((1, 1), np.int64)
    for _ in range(25):
        scores = (rng.normal(size=(1, 49152)) * scale).astype(np.float32)
        sparse = processor.sparse(ids, scores)
        dense = sparse.dense() if sparse is not None else processor(ids, scores)
        kept = np.isfinite(dense[0])
        allowed = reference.allowed(matcher, among=~kept)  # a dropped token must be refused
        assert np.array_equal(kept, allowed), (
            f"keeps {np.flatnonzero(kept & ~allowed)[:10]} llguidance refuses, "
            f"drops {np.flatnonzero(allowed & ~kept)[:10]} it allows"
        )
        assert np.array_equal(dense[0, kept], scores[0, kept])
        finite = np.flatnonzero(kept)
        if greedy:
            pick = int(finite[np.argmax(dense[0, finite])])
        else:
            weights = np.exp(dense[0, finite] - dense[0, finite].max())
            pick = int(rng.choice(finite, p=weights / weights.sum()))
        if pick == 2:
            assert matcher.is_accepting()
            break
        assert matcher.consume_token(pick), matcher.get_error()
        processor.advance([[pick]])
        assert not processor.matchers[0].is_error()
