"""llama.cpp's DRY, top-n-sigma, XTC and mirostat v2 (ortgen.plugins.llamacpp).

The references below transcribe llama.cpp's C++ (ggml-org/llama.cpp, src/llama-sampling.cpp
at commit 0344068cf112e524eb3fbdbd58c171870b63e56c) into plain Python loops, one row at a
time, on llama.cpp's candidate list: the entries that are not -inf.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ortgen import ComponentError, ConfigError
from ortgen.plugins import _dry as dry
from ortgen.plugins import llamacpp as L
from ortgen.plugins.samplers import MultinomialSampler
from ortgen.testing import check_logits_processor, check_sampler, make_context

F32 = np.float32


def ctx_for(vocab: int = 8, batch: int = 1, seed: int | None = 0, **kw):
    return make_context(vocab_size=vocab, batch_size=batch, seed=seed, **kw)


def softmax(scores: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        w = np.exp(scores.astype(np.float64) - scores.max(axis=-1, keepdims=True))
    return w / w.sum(axis=-1, keepdims=True)


def chi2_limit(df: int) -> float:
    """0.999 quantile of chi-square(df), Wilson-Hilferty (scipy may be missing)."""
    z = 3.090232306167813
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def assert_frequencies(picked: np.ndarray, probs: np.ndarray) -> None:
    counts = np.bincount(picked, minlength=probs.size)
    assert counts[probs == 0].sum() == 0, "drew a token of probability 0"
    support = probs > 0
    if support.sum() == 1:  # one possible token: every draw is it
        return
    expected = probs[support] * picked.size
    stat = (((counts[support] - expected) ** 2) / expected).sum()
    assert stat < chi2_limit(int(support.sum()) - 1), (stat, counts, expected)


# --- references (plain loops, transcribed from llama-sampling.cpp) ----------------------


def ref_dry(tokens, logits, mult, base, allowed, last_n, breakers):
    """llama_sampler_dry_apply; ``breakers`` is the multimap as (head, tail) pairs.

    ``tokens`` is the whole context (total_context_size = len(tokens))."""
    logits = [F32(x) for x in logits]
    total = len(tokens)
    if mult == 0 or base < 1 or last_n == 0:
        return logits
    eff = total if last_n == -1 else max(last_n, 0)
    last_tokens = tokens[max(0, total - eff) :]  # the ring buffer of capacity eff
    n = min(len(last_tokens), eff, total)
    if n <= allowed:
        return logits

    def rat(i):
        return last_tokens[len(last_tokens) - 1 - i]

    rep_limit = n
    for i in range(n):
        its = [tail for head, tail in breakers if head == rat(i)]
        if not its:
            continue
        longest = -1
        for tail in its:
            seq_len = len(tail)
            if (
                seq_len > longest
                and seq_len <= i
                and all(tail[o] == rat(i - o - 1) for o in range(seq_len))
            ):
                longest = seq_len
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed:
        return logits

    repeat = [0] * n
    last, rt, lt = n - 1, 0, 0
    for k in range(1, n):
        if k > rt:
            m = 0
            while m + k < n and rat(m) == rat(m + k):
                m += 1
            repeat[last - k] = min(m, rep_limit)
            if m > 0:
                lt, rt = k, k + m - 1
        else:
            p = k - lt
            right = rt - k + 1
            if repeat[last - p] < right:
                repeat[last - k] = min(repeat[last - p], rep_limit)
            else:
                i = rt + 1
                while i < n and rat(i) == rat(i - k):
                    i += 1
                repeat[last - k] = min(i - k, rep_limit)
                lt, rt = k, i - 1

    max_repeat = {}
    for i in range(n - 1):
        if repeat[i] >= allowed:
            token = rat(n - 2 - i)
            if token not in max_repeat or max_repeat[token] < repeat[i]:
                max_repeat[token] = repeat[i]

    base32 = F32(base)
    max_exp = int(F32(88.7228391) / np.log(base32)) if base32 > F32(1.000001) else 0
    for token_id in range(len(logits)):
        if token_id in max_repeat:
            if any(head == token_id and not tail for head, tail in breakers):
                continue
            exp = max_repeat[token_id] - allowed
            if max_exp > 0 and exp > max_exp:
                exp = max_exp
            penalty = F32(float(F32(mult)) * float(base32) ** exp)
            logits[token_id] = F32(logits[token_id] - penalty)
    return logits


def ref_top_n_sigma(logits, n):
    """llama_sampler_top_n_sigma_apply."""
    out = [F32(x) for x in logits]
    if n <= 0 or len(out) <= 1:
        return out
    top, total, count = out[0], 0.0, 0
    for x in out:
        if x != -np.inf:
            top = max(top, x)
            total += float(x)
            count += 1
    mean = total / count if count else 0.0
    acc = sum((float(x) - mean) ** 2 for x in out if x != -np.inf)
    std = math.sqrt(acc / count) if count else 0.0
    return [F32(-np.inf) if x < top - n * std else x for x in out]


def ref_xtc(logits, probability, threshold, min_keep, chance):
    """llama_sample_xtc_apply on the candidates (entries that are not -inf)."""
    out = [F32(x) for x in logits]
    cands = [(i, float(x)) for i, x in enumerate(out) if x != -np.inf]
    if probability <= 0 or threshold > 0.5 or len(cands) < 2:
        return out
    if chance > probability:
        return out
    cands.sort(key=lambda c: -c[1])
    top = cands[0][1]
    weights = [math.exp(x - top) for _, x in cands]
    probs = [w / sum(weights) for w in weights]
    pos_last = 0
    for i, p in enumerate(probs):
        if p >= threshold:
            pos_last = i
        else:
            break
    if len(cands) - pos_last >= min_keep and pos_last > 0:
        for token, _ in cands[:pos_last]:
            out[token] = F32(-np.inf)
    return out


def ref_mirostat_v2_kept(logits, mu):
    """The candidates llama_sampler_mirostat_v2_apply samples from at ``mu`` (sorted)."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    top = logits[order[0]]
    weights = {i: math.exp(logits[i] - top) for i in order}
    total = sum(weights.values())
    kept = []
    for i in order:  # std::find_if: the first candidate whose surprise exceeds mu
        surprise = -math.log2(weights[i] / total) if weights[i] > 0 else math.inf
        if surprise > mu:
            break
        kept.append(i)
    return kept or order[:1]  # "if (cur_p->size == 0) cur_p->size = 1"


def ref_mirostat_v2_update(logits, kept, picked, mu, tau, eta):
    top = max(logits[i] for i in kept)
    total = sum(math.exp(logits[i] - top) for i in kept)
    surprise = -math.log2(math.exp(logits[picked] - top) / total)
    return mu - eta * (surprise - tau)


# --- DRY -------------------------------------------------------------------------------


BREAKER_SETS = [
    [],
    [(3, ())],
    [(3, ()), (1, (2,)), (4, (4, 0))],
    [(0, (1, 2)), (0, (1,)), (5, ())],
]


def test_dry_equals_llamacpp_on_random_contexts():
    changed = broken = 0
    for seed in range(80):
        rng = np.random.default_rng(seed)
        vocab, batch = 8, 3
        length = int(rng.integers(1, 60))
        alphabet = int(rng.integers(2, 6))  # few symbols: many repeats
        ids = rng.integers(0, alphabet, (batch, length)).astype(np.int64)
        if seed % 3 == 0:  # a long verbatim loop
            ids[0] = np.resize(ids[0, :4], length)
        scores = rng.standard_normal((batch, vocab)).astype(np.float32)
        scores[rng.random(scores.shape) < 0.2] = -np.inf
        params = {
            "multiplier": float(rng.choice([0.0, 0.8, 2.5, 2.5])),
            "base": float(rng.choice([1.0, 1.0000005, 1.75, 3.0])),
            "allowed_length": int(rng.integers(0, 4)),
            "penalty_last_n": int(rng.choice([-1, -1, 0, 1, 5, 20])),
        }
        breakers = BREAKER_SETS[seed % len(BREAKER_SETS)]
        proc = L.DryProcessor(**params, sequence_breakers=[], ctx=ctx_for(vocab, batch))
        proc.breakers = dry.Breakers.from_sequences([(h, *t) for h, t in breakers])
        out = check_logits_processor(proc, ids, scores)
        for row in range(batch):
            args = [v for v in params.values()]
            want = ref_dry(ids[row].tolist(), scores[row], *args, breakers)
            np.testing.assert_array_equal(out[row], want, err_msg=f"seed {seed} {params}")
            unbroken = ref_dry(ids[row].tolist(), scores[row], *args, [])
            changed += not np.array_equal(out[row], scores[row])
            broken += not np.array_equal(want, unbroken)
    assert changed > 40 and broken > 8, (changed, broken)  # penalties and breakers ran


def test_dry_worked_example_from_llamacpp_comments():
    # "Last N tokens: a b c c b c y a b c": emitting c, b or y would extend a repeat
    a, b, c, y = 0, 1, 2, 3
    ids = np.array([[a, b, c, c, b, c, y, a, b, c]])
    proc = L.DryProcessor(1.0, 2.0, 1, -1, [], ctx=ctx_for(4))
    out = proc(ids, np.zeros((1, 4), np.float32))
    # c: 3 -> 4 (penalty 2**(3-1)), y: "b c" 2 -> 3 (2**1), b: "c" 1 -> 2 (2**0)
    np.testing.assert_array_equal(out[0], [0, -1, -4, -2])


def test_dry_long_loop_hits_the_exponent_cap():
    ids = np.zeros((1, 300), np.int64)
    proc = L.DryProcessor(1.0, 3.0, 2, -1, [], ctx=ctx_for(4))
    assert proc.max_exponent == 80
    out = proc(ids, np.zeros((1, 4), np.float32))
    want = ref_dry([0] * 300, [0.0] * 4, 1.0, 3.0, 2, -1, [])
    np.testing.assert_array_equal(out[0], np.array(want, np.float32))
    assert np.isfinite(out).all() and out[0, 0] < -1e37


def test_dry_breaker_limits_how_far_back_a_repeat_reaches():
    # "1 2 3 9 1 2 3": with 9 a breaker the repeat may not reach back past it
    ids = np.array([[1, 2, 3, 9, 1, 2, 3]])
    plain = L.DryProcessor(1.0, 2.0, 2, -1, [], ctx=ctx_for(10))
    broken = L.DryProcessor(1.0, 2.0, 2, -1, [], ctx=ctx_for(10))
    broken.breakers = dry.Breakers.from_sequences([(9,)])
    zeros = np.zeros((1, 10), np.float32)
    assert plain(ids, zeros)[0, 9] == -2.0  # "1 2 3" repeats: 9 is penalised
    assert broken(ids, zeros)[0, 9] == 0.0  # a one-token breaker is never penalised
    assert (broken(ids, zeros) == 0).all()  # and the match stops at it: 3 < allowed + 1


def tiny_tokenizer():
    import tokenizers

    from ortgen.text import Tokenizer

    pieces = ["a", "b", "x", "Q", "#", ":", "\n", "a:", "x#", "##", "#Q"]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [("a", ":"), ("x", "#"), ("#", "#"), ("#", "Q")]
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, merges))
    return Tokenizer(backend), vocab


def test_breaker_strings_become_token_sequences_as_in_llamacpp():
    tok, v = tiny_tokenizer()
    ctx = dataclasses.replace(ctx_for(len(v)), tokenizer=tok)
    proc = L.DryProcessor(0.8, 1.75, 2, -1, ["\n", ":", "##Q", ""], ctx=ctx)
    # get_overlapping_token_sequences: tokens containing a breaker are one-token breakers;
    # tokens ending with a proper prefix of "##Q" head the encoding of the rest of it
    assert proc.breakers.single.tolist() == sorted([v["\n"], v[":"], v["a:"]])
    want = {(v["#"], v["#Q"]), (v["x#"], v["#Q"]), (v["##"], v["#Q"]), (v["##"], v["Q"])}
    assert set(map(tuple, proc.breakers.longer[1].tolist())) == want
    assert dry.tokenize_breakers(tok, ("\n", ":", "##Q")) is proc.breakers  # cached


def test_breaker_strings_need_a_tokenizer():
    with pytest.raises(ConfigError, match=r"tokenizer.*sequence_breakers=\[\]"):
        L.DryProcessor(0.8, ctx=ctx_for())
    L.DryProcessor(0.0, ctx=ctx_for())  # off: the breakers are never needed
    L.DryProcessor(0.8, sequence_breakers=[], ctx=ctx_for())


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"multiplier": -1.0}, "multiplier"),
        ({"multiplier": 1.0, "base": 0.5}, "base"),
        ({"multiplier": 1.0, "allowed_length": -1}, "allowed_length"),
        ({"multiplier": 1.0, "allowed_length": 1.5}, "allowed_length"),
        ({"multiplier": 1.0, "penalty_last_n": -2}, "penalty_last_n"),
        ({"multiplier": 1.0, "sequence_breakers": [1]}, "sequence_breakers"),
    ],
)
def test_dry_bad_parameters(params, message):
    params.setdefault("sequence_breakers", [])
    with pytest.raises(ConfigError, match=message):
        L.DryProcessor(**params, ctx=ctx_for())


# --- top-n-sigma ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_top_n_sigma_equals_llamacpp(seed):
    rng = np.random.default_rng(seed)
    scores = (rng.standard_normal((5, 40)) * 3).astype(np.float32)
    scores[rng.random(scores.shape) < 0.3] = -np.inf
    scores[4] = -np.inf  # a row with no candidates is left alone
    n = float(rng.choice([0.5, 1.0, 2.0, 0.0]))
    out = check_logits_processor(L.TopNSigmaProcessor(n), np.zeros((5, 1), np.int64), scores)
    for row in range(5):
        np.testing.assert_array_equal(out[row], ref_top_n_sigma(scores[row], n))


def test_top_n_sigma_leaves_nan_and_inf_rows_alone():
    scores = np.array([[0, 1, np.nan, 5], [0, 1, np.inf, 5]], np.float32)
    out = L.TopNSigmaProcessor(0.1)(np.zeros((2, 1), np.int64), scores)
    np.testing.assert_array_equal(out, scores)


def test_multinomial_after_top_n_sigma_matches_the_distribution():
    draws, scores = 20_000, np.array([2.0, 1.5, 1.4, 0.0, -1, -2, 1.9, -np.inf], np.float32)
    batch = np.tile(scores, (draws, 1))
    processed = L.TopNSigmaProcessor(0.6)(np.zeros((draws, 1), np.int64), batch)
    assert 2 <= np.isfinite(processed[0]).sum() < 7
    picked = MultinomialSampler(ctx=ctx_for(8, draws, seed=5))(None, processed)
    assert_frequencies(picked, softmax(processed[0]))


# --- XTC ------------------------------------------------------------------------------


def xtc_chances(seed: int, batch: int, calls: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(L._XTC_STREAM,)))
    return [rng.random(batch, dtype=np.float32) for _ in range(calls)]


@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.6])
@pytest.mark.parametrize("min_keep", [0, 1, 3])
def test_xtc_equals_llamacpp(threshold, min_keep):
    rng = np.random.default_rng(int(threshold * 100) + min_keep)
    batch, vocab = 64, 12
    scores = (rng.standard_normal((batch, vocab)) * 1.5).astype(np.float32)
    scores[rng.random(scores.shape) < 0.25] = -np.inf
    scores[:3, 2:] = -np.inf  # rows with two candidates
    scores[3, 1:] = -np.inf  # one candidate
    proc = L.XtcProcessor(0.5, threshold, min_keep, ctx=ctx_for(vocab, batch, seed=7))
    ids = np.zeros((batch, 1), np.int64)
    outs = [check_logits_processor(proc, ids, scores) for _ in range(2)]
    for out, chance in zip(outs, xtc_chances(7, batch, 2), strict=True):
        for row in range(batch):
            want = ref_xtc(scores[row], 0.5, threshold, min_keep, chance[row])
            np.testing.assert_array_equal(out[row], want, err_msg=f"row {row}")
    if threshold in (0.1, 0.2):
        assert any((o != scores).any() for o in outs)  # some rows were cut


@pytest.mark.parametrize("threshold", [0.0, 0.001, 0.02, 0.1])
def test_xtc_divides_only_near_the_threshold_yet_finds_every_token_above_it(threshold):
    """On a full row XTC divides only the weights near ``threshold * total``; the tokens it
    removes must be exactly those the whole-row test finds above the threshold, but the
    least probable of them."""
    rng = np.random.default_rng(int(threshold * 1000))
    proc = L.XtcProcessor(1.0, threshold, ctx=ctx_for(49152, 1))
    for _ in range(5):
        scores = (rng.standard_normal((1, 49152)) * rng.uniform(1, 6)).astype(np.float32)
        weights = np.exp(scores[0] - scores[0].max())
        above = (weights / weights.sum(dtype=np.float64)).astype(np.float32) >= threshold
        out = proc(np.zeros((1, 1), np.int64), scores)
        removed = ~np.isfinite(out[0])
        if above.sum() < 2:
            assert not removed.any()
            continue
        lowest = np.flatnonzero(above & (scores[0] == scores[0][above].min()))[-1]
        above[lowest] = False
        np.testing.assert_array_equal(removed, above)


def test_xtc_keeps_the_highest_id_among_tied_lowest():
    scores = np.array([[3.0, 2.0, 2.0, -5.0]], np.float32)
    out = L.XtcProcessor(1.0, 0.1, ctx=ctx_for(4))(np.zeros((1, 1), np.int64), scores)
    np.testing.assert_array_equal(out, [[-np.inf, -np.inf, 2.0, -5.0]])


@pytest.mark.parametrize("probability", [1.0, 0.5])
def test_multinomial_after_xtc_matches_the_distribution(probability):
    draws = 20_000
    scores = np.array([2.0, 1.8, 1.5, 0.2, 0.0, -1.0, -np.inf, -0.5], np.float32)
    batch = np.tile(scores, (draws, 1))
    ctx = ctx_for(8, draws, seed=11)
    processed = L.XtcProcessor(probability, 0.1, ctx=ctx)(np.zeros((draws, 1), np.int64), batch)
    cut = ref_xtc(scores, 1.0, 0.1, 1, 0.0)
    assert np.isinf(cut[:2]).all() and np.isfinite(cut[2])
    want = probability * softmax(np.array(cut)) + (1 - probability) * softmax(scores)
    picked = MultinomialSampler(ctx=ctx)(None, processed)
    assert_frequencies(picked, want)


def test_xtc_has_its_own_random_stream():
    ctx = ctx_for(8, 4, seed=3)
    proc = L.XtcProcessor(0.5, 0.1, ctx=ctx)
    proc(np.zeros((4, 1), np.int64), np.zeros((4, 8), np.float32))
    fresh = np.random.default_rng(3).random(4, dtype=np.float32)
    assert not np.allclose(xtc_chances(3, 4)[0], fresh)  # not the sampler's stream


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"probability": 1.5}, "probability"),
        ({"probability": 0.5, "threshold": -0.1}, "threshold"),
        ({"probability": 0.5, "min_tokens_to_keep": -1}, "min_tokens_to_keep"),
        ({"probability": float("nan")}, "probability"),
    ],
)
def test_xtc_bad_parameters(params, message):
    with pytest.raises(ConfigError, match=message):
        L.XtcProcessor(**params, ctx=ctx_for())


# --- mirostat v2 -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_mirostat_v2_equals_llamacpp_step_by_step(seed):
    rng = np.random.default_rng(seed)
    batch, vocab, tau, eta = 6, 30, 3.0, 0.3
    sampler = L.MirostatV2Sampler(tau, eta, ctx=ctx_for(vocab, batch, seed=seed))
    mu = [F32(2 * tau)] * batch
    for _ in range(8):
        scores = (rng.standard_normal((batch, vocab)) * 2).astype(np.float32)
        scores[rng.random(scores.shape) < 0.2] = -np.inf
        scores[:, 0] = np.maximum(scores[:, 0], 0)
        picked = check_sampler(sampler, np.zeros((batch, 1), np.int64), scores)
        for row in range(batch):
            logits = [float(x) for x in scores[row]]
            kept = ref_mirostat_v2_kept(logits, float(mu[row]))
            assert picked[row] in kept
            mu[row] = ref_mirostat_v2_update(logits, kept, picked[row], float(mu[row]), tau, eta)
        np.testing.assert_allclose(sampler.mu, mu, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vocab", [40, 49152])
def test_mirostat_v2_truncation_tests_every_token_it_must(vocab):
    """The truncation takes a log only of the weights near ``total * 2**-mu``; it must
    keep exactly the tokens the whole-row test ``-log2(w / total) <= mu`` keeps (float32,
    as llama.cpp), from a ``mu`` that keeps only the top token to one that keeps all."""
    rng = np.random.default_rng(vocab)
    sampler = L.MirostatV2Sampler(ctx=ctx_for(vocab, 1))
    for mu in (-3.0, 0.0, 0.7, 2.0, 5.0, 9.0, 14.0, 40.0, 500.0):
        scores = (rng.standard_normal((1, vocab)) * rng.uniform(0.5, 4)).astype(np.float32)
        weights = np.exp(scores[0] - scores[0].max())
        with np.errstate(divide="ignore"):
            keep = -np.log2(weights / weights.sum()) <= np.float32(mu)
        keep[np.argmax(scores[0])] = True
        got = sampler.distribution(scores, np.array([mu], np.float32))
        np.testing.assert_array_equal(np.isfinite(got[0]), keep)
        np.testing.assert_array_equal(got[0, keep], scores[0, keep])


@pytest.mark.parametrize("mu", [0.5, 2.0, 3.5, 10.0])
def test_mirostat_v2_draws_follow_the_truncated_distribution(mu):
    draws = 20_000
    scores = np.array([1.0, 2.5, 0.3, -0.4, 2.0, -np.inf, 0.9, -1.5], np.float32)
    sampler = L.MirostatV2Sampler(5.0, 0.1, ctx=ctx_for(8, draws, seed=21))
    sampler.mu = np.full(draws, mu, np.float32)
    picked = sampler(None, np.tile(scores, (draws, 1)))
    kept = ref_mirostat_v2_kept([float(x) for x in scores], mu)
    want = np.zeros(8)
    want[kept] = softmax(scores[kept])
    assert_frequencies(picked, want)


def test_mirostat_v2_is_reproducible_with_a_seed_and_starts_at_two_tau():
    rng = np.random.default_rng(0)
    steps = [rng.standard_normal((3, 16)).astype(np.float32) for _ in range(5)]
    runs = []
    for _ in range(2):
        sampler = L.MirostatV2Sampler(4.0, 0.2, ctx=ctx_for(16, 3, seed=9))
        assert sampler.mu is None
        runs.append([sampler(None, s).tolist() for s in steps] + [sampler.mu.tolist()])
    assert runs[0] == runs[1]
    first = L.MirostatV2Sampler(4.0, 0.2, ctx=ctx_for(16, 3, seed=9))
    first(None, steps[0])
    assert first.mu is not None and not np.allclose(first.mu, 8.0)


@pytest.mark.parametrize(
    ("bad", "message"), [([-np.inf] * 4, "all -inf"), ([0, np.nan, 1, 2], "NaN")]
)
def test_mirostat_v2_refuses_a_row_without_a_pick(bad, message):
    scores = np.array([[0, 1, 2, 3], bad], np.float32)
    with pytest.raises(ComponentError, match=f"'mirostat_v2'.*row 1.*{message}"):
        L.MirostatV2Sampler(ctx=ctx_for(4, 2))(None, scores)


def test_mirostat_v2_bad_parameters_and_batch_change():
    for params in ({"tau": 0.0}, {"eta": -1.0}, {"tau": float("inf")}):
        with pytest.raises(ConfigError):
            L.MirostatV2Sampler(**params, ctx=ctx_for())
    sampler = L.MirostatV2Sampler(ctx=ctx_for(4, 2))
    sampler(None, np.zeros((2, 4), np.float32))
    with pytest.raises(ComponentError, match="one state per row"):
        sampler(None, np.zeros((3, 4), np.float32))


# --- properties -------------------------------------------------------------------------

FLOATS = st.one_of(st.floats(-30, 30, width=32), st.just(float("-inf")))


@settings(max_examples=60, deadline=None)
@given(
    scores=hnp.arrays(
        np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=9), elements=FLOATS
    ),
    data=st.data(),
)
def test_processors_keep_shape_dtype_inputs_and_add_no_nan(scores, data):
    batch, vocab = scores.shape
    length = data.draw(st.integers(1, 12))
    ids = data.draw(hnp.arrays(np.int64, (batch, length), elements=st.integers(0, vocab - 1)))
    ctx = ctx_for(vocab, batch, seed=data.draw(st.integers(0, 5)))
    procs = [
        L.DryProcessor(data.draw(st.floats(0, 3)), data.draw(st.floats(1, 4)), 1, -1, [], ctx=ctx),
        L.TopNSigmaProcessor(data.draw(st.floats(0.1, 3))),
        L.XtcProcessor(data.draw(st.floats(0, 1)), data.draw(st.floats(0, 0.6)), ctx=ctx),
    ]
    for proc in procs:
        out = check_logits_processor(proc, ids, scores)
        assert out.dtype == np.float32 and out.shape == scores.shape
        assert not np.isnan(out).any()
        assert ((out == -np.inf) | (out <= scores)).all()  # they only lower or remove
        has_candidate = (scores > -np.inf).any(axis=1)
        if not isinstance(proc, L.DryProcessor):
            assert ((out > -np.inf).any(axis=1) == has_candidate).all()  # never empties a row


@settings(max_examples=40, deadline=None)
@given(
    scores=hnp.arrays(
        np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=9), elements=FLOATS
    ),
    tau=st.floats(0.1, 8),
)
def test_mirostat_v2_picks_a_possible_token(scores, tau):
    scores[:, 0] = np.where(np.isfinite(scores[:, 0]), scores[:, 0], 0)
    batch = scores.shape[0]
    sampler = L.MirostatV2Sampler(tau, 0.1, ctx=ctx_for(scores.shape[1], batch, seed=1))
    for _ in range(3):
        picked = check_sampler(sampler, np.zeros((batch, 1), np.int64), scores)
        assert picked.dtype == np.int64 and picked.shape == (batch,)
        assert np.isfinite(scores[np.arange(batch), picked]).all()
        assert np.isfinite(sampler.mu).all()


# --- through the flat settings ---------------------------------------------------------------


SETTINGS = [
    {"top_n_sigma": 1.0},
    {"xtc_probability": 0.5, "xtc_threshold": 0.05},
    {"dry_multiplier": 0.8, "dry_sequence_breakers": []},
    {
        "dry_multiplier": 0.8,
        "dry_allowed_length": 1,
        "dry_penalty_last_n": 4,
        "dry_sequence_breakers": [],
    },
    {"mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2},
    {"top_n_sigma": 2.0, "xtc_probability": 1.0, "mirostat": 2, "temperature": 0.8},
]


@pytest.mark.parametrize("flat", SETTINGS)
def test_flat_settings_run_and_reproduce(tiny_llama_gen, flat):
    def run(seed):
        out = tiny_llama_gen.generate(
            [5, 6, 7], do_sample=True, seed=seed, max_new_tokens=12, **flat
        )
        return out.tokens

    first = run(1)
    assert first[0]  # (a row may stop at EOS before 12)
    assert run(1) == first


def test_xtc_that_removes_nothing_leaves_the_draws_alone(tiny_llama_gen):
    # threshold 0.5: no two tokens can both reach it, yet XTC draws every step
    plain = tiny_llama_gen.generate([5, 6, 7], do_sample=True, seed=4, max_new_tokens=10)
    xtc = tiny_llama_gen.generate(
        [5, 6, 7], do_sample=True, seed=4, max_new_tokens=10, xtc_probability=1.0, xtc_threshold=0.5
    )
    assert xtc.tokens == plain.tokens


def test_dry_on_a_loop_changes_the_greedy_continuation(tiny_llama_gen):
    prompt, bias = [5, 6, 7, 8] * 6, {5: 60.0}  # the bias makes 5 the greedy pick
    plain = tiny_llama_gen.generate(prompt, max_new_tokens=1, logit_bias=bias).tokens[0]
    dry = tiny_llama_gen.generate(
        prompt, max_new_tokens=1, logit_bias=bias, dry_multiplier=1.0, dry_sequence_breakers=[]
    ).tokens[0]
    assert plain == [5]
    assert dry != [5]  # 5 would continue a 23-token repeat: 1.75 ** 21 below the rest


@pytest.mark.parametrize(
    ("flat", "message"),
    [
        ({"dry_multiplier": 0.8}, "tokenizer"),
        ({"dry_multiplier": -1.0}, "dry_multiplier"),
        ({"dry_base": 0.5, "dry_multiplier": 1.0}, "dry_base"),
        ({"top_n_sigma": -1.0}, "top_n_sigma"),
        ({"xtc_probability": 2.0}, "xtc_probability"),
        ({"xtc_threshold": -0.5, "xtc_probability": 0.5}, "xtc_threshold"),
        ({"mirostat": 1}, "mirostat"),
        ({"mirostat": 2, "mirostat_tau": 0.0}, "mirostat_tau"),
    ],
)
def test_bad_flat_settings_raise_config_error(tiny_llama_gen, flat, message):
    with pytest.raises(ConfigError, match=message):
        tiny_llama_gen.generate([5, 6, 7], do_sample=True, max_new_tokens=2, **flat)


def test_components_by_name_from_a_pipeline(tiny_llama_gen):
    out = tiny_llama_gen.generate(
        [5, 6, 7],
        do_sample=True,
        seed=2,
        max_new_tokens=5,
        logits_processors=[{"name": "top_n_sigma", "n": 1.5}],
        sampler={"name": "mirostat_v2", "tau": 2.0, "eta": 0.5},
    )
    assert out.tokens[0]
