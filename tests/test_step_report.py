"""``step()`` returns what it did per row (``StepReport``), and ``admit()`` what it did
(``Admitted``): callers read them instead of diffing counters around the call. Each is
checked against what the step object holds afterwards, over whole requests."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import ortgen
from ortgen.serve.engine import Engine
from tests.test_serve_engine import fused_chat  # noqa: F401 (a fixture)
from tests.test_speculative import PROMPTS, WRONG, Plugin, scripted


@pytest.fixture(scope="module")
def gen(tiny_model_dirs):
    """The tiny Llama, with the scripted drafter of the speculation tests."""
    return ortgen.load(tiny_model_dirs["llama"][1], threads=1, plugins=[Plugin()])


def _drive(state) -> tuple[list[list[int]], list[int], list[int], int, int]:
    """Every row's tokens as the reports tell them, the step each row ended in, how many
    steps gave some row more than one token, and the drafts the reports counted."""
    got: list[list[int]] = [[] for _ in range(state.batch_size)]
    ended = [-1] * state.batch_size
    several = drafted = kept = 0
    step = 0
    while not state.is_done:
        report = state.step()
        assert report.ids.shape == (state.batch_size,)
        for row in range(state.batch_size):
            new = state.ids[row, int(report.starts[row]) : int(report.ends[row])].tolist()
            assert len(new) == report.new_tokens(row)
            if new:
                assert new[-1] == int(report.ids[row])  # the last column step() appended
            got[row].extend(new)
            several += report.new_tokens(row) > 1
            if report.finished[row]:
                assert ended[row] == -1 and not state.unfinished[row]
                ended[row] = step
        drafted, kept = drafted + report.drafted, kept + report.kept
        step += 1
    return got, ended, [several], drafted, kept


def test_a_batch_with_rows_ending_apart(gen):
    """Two rows of different lengths: the reports add up to each row's tokens, and each
    row is reported finished exactly once, at the step its length ran out."""
    prompts = [
        {"prompt": PROMPTS[0], "max_new_tokens": 3},
        {"prompt": PROMPTS[1], "max_new_tokens": 7},
    ]
    state = gen.start(prompts, eos_token_id=None)
    got, ended, _, drafted, _ = _drive(state)
    assert got == [state.generated(0), state.generated(1)]
    assert [len(t) for t in got] == [3, 7]
    assert ended == [2, 6]  # the prefill step is step 0
    assert drafted == 0


def test_a_speculative_step_reports_every_kept_token_and_the_drafts(gen):
    """A scripted drafter (plain decoding's continuation, wrong at known positions):
    steps that keep drafts report several tokens, and the drafts the reports count are
    the request's own totals."""
    prompt = PROMPTS[0]
    plain = gen.generate(prompt, max_new_tokens=30, eos_token_id=None)
    settings = scripted(plain.tokens[0], len(prompt))
    state = gen.start(prompt, max_new_tokens=30, eos_token_id=None, **settings)
    got, _, several, drafted, kept = _drive(state)
    assert got == plain.tokens  # token for token, as the reports tell it
    stats = state.speculation_stats()
    assert (drafted, kept) == (stats["drafted"], stats["accepted"])
    assert kept > 0 and several[0] > 0 and drafted > kept
    assert WRONG  # the script rejects some drafts: drafted > kept above


def test_admitted_says_which_prefill_was_shared(fused_chat):  # noqa: F811
    """The same prompt admitted twice copies the first prefill (the server counts it as
    a shared prefill); another prompt does not."""
    gen = fused_chat
    engine = Engine(gen, max_batch=4)  # never started: its open batch, driven by hand
    batch = engine.open_batch()
    settings = {"max_new_tokens": 4, "eos_token_id": None}

    def admit(text: str):
        prompt = gen.tokenizer.encode(text)
        chain = engine.check_components(prompt, engine.check(prompt, settings))
        chain = dataclasses.replace(
            chain, cache=batch.chain.cache, cache_name=batch.chain.cache_name
        )
        return batch.admit(prompt, chain)

    first, again, other = admit("the same words"), admit("the same words"), admit("others")
    assert [a.row for a in (first, again, other)] == [0, 1, 2]
    assert [a.shared_prefill for a in (first, again, other)] == [False, True, False]
    assert np.array_equal(batch.ids[0, : batch.length], batch.ids[1, : batch.length])
