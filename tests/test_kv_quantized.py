"""The ``quantized`` KV cache: past keys/values held as 8- or 4-bit codes.

What quantization costs is measured teacher-forced: the same fixed tokens are fed with
the static cache and with the quantized one, and the argmax of every position's logits
is compared (greedy tokens diverge for good after one flip, so they say little).
Bookkeeping (packed prefill, chunks, beam reorders, rewinds) is tested where the answer
is exact: a row in a batch against the same row alone, one path against an equivalent
one, or with ``group=1`` (a scale per element: nearly lossless) against the static cache.

Measured while writing this (onnxruntime 1.32, 1 thread; 8 bits unless said):
- tiny models, teacher-forced top-1 vs static over 4 x 113 positions of random tokens:
  llama 0.93, qwen2 0.94, gpt2 0.99 (4 bits: 0.51 / 0.53 / 0.81). These random-weight
  models are far more sensitive than trained ones (logit std 4, median top-1 gap 1).
- default model (SmolLM2-135M, int4 weights, fused), ~200 positions of STORY: 0.89 (4 bits
  0.85). That graph (MatMulNBits, accuracy_level 4) rounds its activations to int8 on
  the fly, so any change to the past flips some of those roundings: merely rounding the
  past to float16 gives 0.91 (0.905-0.91 on four windows of text where 8 bits gave
  0.86-0.93).
  On the same weights at fp32 (the quality reference): 8 bits 0.99, 4 bits 0.88, float16
  1.0. So >= 0.95 holds for the cache itself, not on the int4 graph, whose noise floor
  is lower than that.
- greedy, 32 tokens after the first 40 of STORY: at fp32, 8 and 4 bits leave static's path
  at token 3, a near-tie (fp32 margin 0.019); on the int4 graph the paths part at near-ties
  that depend on the CPU (issue 36: 8 bits followed static for 15 tokens on one CPU, 3 on
  another). So greedy paths are judged token by token against the fp32 graph.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import ortgen
from ortgen.model.session import GraphSignature
from ortgen.plugins.kv_quantized import QuantizedCache
from ortgen.testing import NEAR_TIE, agreement, make_context, reference_greedy

PROMPTS = [[1, 5, 9, 33, 70, 12], [1, 44, 3], [1, 100, 101, 102, 103, 104, 105, 106, 107]]
NEW = 12
Q4 = {"name": "quantized", "bits": 4}
#: float32 graphs differ between CPUs by summation order (~1e-5 of a logit)
FP32_TIE = 1e-3
NEAR_LOSSLESS = {"name": "quantized", "group": 1}
STORY = (
    "The bridge keeper checked the tide tables twice before dawn, because the river had a "
    "habit of rising faster than the almanac promised. On the morning of the storm, she wrote "
    "three numbers in her notebook: the height of the water at the third pier, the speed of "
    "the wind from the north-west, and the number of carts already waiting on the southern "
    "bank. None of them was alarming on its own. Together they meant that the old wooden span "
    "would have to close by noon, and that the market in the lower town would lose a day of "
    "trade. She walked to the signal house, lit the amber lamp, and sent the boy with a "
    "message for the mayor. By the time the first drops fell, the carts had turned back, the "
    "ferrymen had tied up their boats, and the baker on the corner was already complaining "
    "that nobody would buy bread on a day like this. In the afternoon the water reached the "
    "mark painted on the stone in the year of the great flood, and then it began to fall."
)


def _cache(bits: int, group: int | None, *, batch: int = 2, dim: int = 64) -> QuantizedCache:
    """A quantized cache for a made-up concat graph (2 layers, 2 KV heads)."""
    signature = GraphSignature(
        input_names=(), past_inputs=("k0", "v0", "k1", "v1"), present_outputs=(),
        num_layers=2, num_kv_heads=2, head_dim=dim, kv_dtype=np.float32, vocab_size=8,
        has_position_ids=True, has_attention_mask=True,
    )  # fmt: skip
    ctx = dataclasses.replace(make_context(batch_size=batch, max_length=64), signature=signature)
    return QuantizedCache(ctx=ctx, bits=bits, group=group)


def _round_trip(cache: QuantizedCache, presents: list[np.ndarray]) -> np.ndarray:
    cache.update(presents)
    return np.stack(list(cache.inputs().values()))


def _groups(x: np.ndarray, group: int) -> np.ndarray:
    return x.reshape(*x.shape[:-1], -1, group)


@pytest.mark.parametrize(("bits", "group"), [(8, None), (8, 16), (4, None), (4, 8)])
def test_round_trip_error_is_at_most_half_a_step(bits: int, group: int | None) -> None:
    rng = np.random.default_rng(bits)
    x = (rng.standard_normal((4, 2, 2, 50, 64)) * 3 + rng.standard_normal(64)).astype(np.float32)
    size = group or (64 if bits == 8 else 32)  # the defaults: head_dim, and 32
    back = _groups(_round_trip(cache := _cache(bits, group), list(x)), size)
    g = _groups(x, size)
    eps = 2.0**-10  # float16 rounding of a scale (up) and a minimum (down)
    if bits == 8:
        step = np.abs(g).max(axis=-1, keepdims=True) / 127 * (1 + eps)
        assert all(len(np.unique(v)) <= 255 for v in back.reshape(-1, size))
    else:
        low = g.min(axis=-1, keepdims=True)
        step = (g.max(axis=-1, keepdims=True) - low + np.abs(low) * eps) / 15 * (1 + eps)
        assert all(len(np.unique(v)) <= 16 for v in back.reshape(-1, size))
    error = np.abs(back - g)
    assert (error <= step / 2 + 1e-6).all()
    assert error.max() > step.max() / 8  # it does round
    assert cache.length == 50


def test_representable_values_come_back_exactly() -> None:
    rng = np.random.default_rng(0)
    shape = (4, 2, 2, 20, 2, 32)  # two groups of 32 per head_dim of 64
    scale = 2.0 ** rng.integers(-8, 3, (*shape[:-1], 1))
    q8 = rng.integers(-127, 128, shape)
    q8[..., 0] = 127  # each group reaches the top code
    x8 = (q8 * scale).reshape(4, 2, 2, 20, 64).astype(np.float32)
    assert np.array_equal(_round_trip(_cache(8, 32), list(x8)), x8)
    q4 = rng.integers(0, 16, shape)
    q4[..., 0], q4[..., 1] = 0, 15  # each group spans its whole range
    low = rng.integers(-64, 64, (*shape[:-1], 1)) / 16
    x4 = (q4 * scale + low).reshape(4, 2, 2, 20, 64).astype(np.float32)
    assert np.array_equal(_round_trip(_cache(4, 32), list(x4)), x4)


def test_nbytes_counts_codes_scales_and_minimums() -> None:
    positions = 4 * 2 * 2 * 64  # tensors (2 x layers) x rows x heads x capacity (max_length)
    assert _cache(8, None).nbytes == positions * (64 + 2 * 1)
    assert _cache(8, 16).nbytes == positions * (64 + 2 * 4)
    assert _cache(4, None).nbytes == positions * (32 + 2 * 2 * 2)
    assert _cache(4, 8).nbytes == positions * (32 + 2 * 2 * 8)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"bits": 3}, r"`bits` has to be 8 or 4, but is 3"),
        ({"bits": "8"}, r"`bits` has to be 8 or 4"),
        ({"group": 5}, r"`group` has to be a divisor of head_dim 16 \(1, 2, 4, 8, 16\)"),
        ({"bits": 4, "group": 1}, r"`group` has to be an even divisor of head_dim 16"),
        ({"group": 32}, r"`group` .* but is 32"),
        ({"scale": 1}, r"unexpected 'scale'.*accepts bits, group"),
    ],
)
def test_bad_parameters_are_named(tiny_llama_gen, params: dict, message: str) -> None:
    with pytest.raises(ortgen.ConfigError, match=message):
        tiny_llama_gen.generate([1, 2, 3], max_new_tokens=2, cache={"name": "quantized", **params})


# ------------------------------------------------------------------------ tiny models


@pytest.fixture(scope="module", params=["llama", "gpt2", "qwen2", "fused-llama", "fused-qwen2"])
def gen(request: pytest.FixtureRequest, tiny_model_dirs, fused_model_dirs):
    """A tiny model of each graph family: optimum (concat) and fused (shared buffer)."""
    fused, _, arch = request.param.rpartition("-")
    dirs = fused_model_dirs if fused else tiny_model_dirs
    return ortgen.load(dirs[arch][1], threads=1)


def _forced_logits(gen, tokens: list[int], cache, start: int = 8) -> np.ndarray:
    """Last-position logits after each prefix tokens[:n], n >= start: the loop's teacher
    forcing (one prefill, then the fixed tokens one by one) through ``cache``."""
    state = gen.start(tokens[:start], max_new_tokens=len(tokens), eos_token_id=None, cache=cache)
    logits = [state.force()[0].copy()]
    logits += [state.force([token])[0].copy() for token in tokens[start:]]
    return np.asarray(logits)


def test_teacher_forced_top1_agreement_on_tiny_models(gen) -> None:
    """8 bits: the argmax agrees with the static cache's at >= 90% of positions; logits
    differ a little, but they differ (the past really is quantized); 4 bits differ more."""
    rng = np.random.default_rng(0)
    sequences = [[1, *rng.integers(3, 256, 119).tolist()] for _ in range(4)]
    agree: dict[str, list[np.ndarray]] = {"8": [], "4": []}
    diff: dict[str, list[np.ndarray]] = {"8": [], "4": []}
    for tokens in sequences:
        ref = _forced_logits(gen, tokens, "static")
        for bits, spec in (("8", "quantized"), ("4", Q4)):
            logits = _forced_logits(gen, tokens, spec)
            assert np.array_equal(logits[0], ref[0])  # prefill sees no quantized past
            agree[bits].append(logits.argmax(axis=1) == ref.argmax(axis=1))
            diff[bits].append(np.abs(logits - ref)[1:].mean(axis=1))
    top1 = {bits: float(np.concatenate(a).mean()) for bits, a in agree.items()}
    mean = {bits: float(np.concatenate(d).mean()) for bits, d in diff.items()}
    print(f"{gen.path.name}: top-1 agreement {top1}, mean |logit diff| {mean}")
    assert top1["8"] >= 0.9
    assert 1e-3 < mean["8"] < 0.2
    assert np.concatenate(diff["8"]).min() > 0  # every decode position was perturbed
    assert mean["4"] > 2 * mean["8"]


@pytest.mark.parametrize("cache", ["quantized", Q4])
def test_a_batch_of_mixed_lengths_gives_each_row_what_it_gives_alone(gen, cache) -> None:
    """Quantization is per row and position, so batching changes nothing: exactly on fused
    graphs (rows packed, prefilled one by one via select); on optimum graphs the padded
    rows' float math differs from the row alone by ~1e-6 (onnxruntime, not the cache), so
    logprobs get a tolerance there, tokens none."""
    batch = gen.generate(PROMPTS, max_new_tokens=NEW, eos_token_id=None, cache=cache, logprobs=True)
    assert batch.tokens[0] != batch.tokens[1]
    for row, prompt in enumerate(PROMPTS):
        alone = gen.generate(
            prompt, max_new_tokens=NEW, eos_token_id=None, cache=cache, logprobs=True
        )
        assert batch.tokens[row] == alone.tokens[0]
        tolerance = 0 if gen.model.signature.shared_kv else 1e-4
        np.testing.assert_allclose(batch.logprobs[row], alone.logprobs[0], rtol=0, atol=tolerance)


def test_bookkeeping_with_a_nearly_lossless_group(gen) -> None:
    """group=1 (a scale per element) stores values to ~1e-3: a padded batch prefilled in
    chunks of 2 (row by row on fused graphs) and beam search then equal the static cache."""
    results = {}
    for cache in ("static", NEAR_LOSSLESS):
        state = gen.start(PROMPTS, max_new_tokens=NEW, eos_token_id=None, cache=cache)
        state.prefill_chunk = 2
        while not state.is_done:
            state.step()
        greedy = [state.generated(row) for row in range(len(PROMPTS))]
        beams = gen.generate(
            PROMPTS[0], max_new_tokens=10, num_beams=3, eos_token_id=None, cache=cache
        )
        results[str(cache)] = (greedy, beams.tokens)
    assert results["static"] == results[str(NEAR_LOSSLESS)]


def test_beam_search_with_8_bits_equals_static_on_tiny_gpt2(tiny_model_dirs) -> None:
    """Beams compare sums of logprobs, so a small perturbation can swap two close beams:
    equality holds on the tiny gpt2 for these prompts (on the tiny llama/qwen2, whose
    logits are much more sensitive, the first prompt's beams differ; test_reorder_* and
    the group=1 test cover those)."""
    gen = ortgen.load(tiny_model_dirs["gpt2"][1], threads=1)
    for prompt in PROMPTS:
        outs = [
            gen.generate(prompt, max_new_tokens=10, num_beams=3, eos_token_id=None, cache=cache)
            for cache in ("static", "quantized")
        ]
        assert outs[0].tokens == outs[1].tokens


def _past(state) -> np.ndarray:
    return np.stack([np.asarray(v) for v in state.chain.cache.inputs().values()])


# with ``residual`` a ring of exact recent positions moves and rewinds with the codes
RINGS = [{**Q4, "residual": 3}, {**Q4, "residual": 40}]


@pytest.mark.parametrize("cache", ["quantized", *RINGS], ids=["8bit", "ring3", "ring40"])
def test_reorder_moves_rows_exactly(gen, cache) -> None:
    """After reorder(rows) the cache holds what a batch of those rows would hold; rows may
    repeat and the batch may shrink. On fused graphs rows of different lengths keep their
    own counts (each row alone, via select, shows just its positions)."""
    shared = gen.model.signature.shared_kv
    prompts = PROMPTS if shared else [[1, 5, 9, 33], [1, 44, 3, 80], [1, 100, 101, 102]]

    def started(rows: list[list[int]]):
        state = gen.start(rows, max_new_tokens=4, eos_token_id=None, cache=cache)
        for _ in range(3):
            state.step()
        return state

    tokens = [started([p]).sequences[0].tolist() for p in prompts]
    for order in ([2, 0, 0], [1]):
        moved = started(prompts)
        moved.chain.cache.reorder(np.asarray(order))
        expected = started([prompts[i] for i in order])
        assert [s[-3:] for s in expected.sequences.tolist()] == [tokens[i][-3:] for i in order]
        assert np.array_equal(_past(moved), _past(expected))
        assert moved.chain.cache.length == expected.chain.cache.length
        if order == [2, 0, 0]:  # the same rows and capacity: the same bytes, ring included
            assert moved.chain.cache.nbytes == expected.chain.cache.nbytes
        for row in range(len(order) if shared else 0):
            for state in (moved, expected):
                state.chain.cache.select(row)
            assert np.array_equal(_past(moved), _past(expected))
            assert _past(moved).shape[3] == len(prompts[order[row]]) + 2


@pytest.mark.parametrize("cache", ["quantized", RINGS[1]], ids=["8bit", "ring40"])
def test_rewind_forgets_like_never_generating(gen, cache) -> None:
    """Rewinding 3 of 6 tokens, then one step, leaves exactly what 4 steps leave: every row,
    padded or packed, drops the same 3 positions. With a ring this holds when it held the
    rewound positions' predecessors (R = 40); with R = 3 the positions pushed out of the
    ring stay quantized after a rewind (the exact window shrinks, it is not refilled)."""
    states = []
    for new, rewind in ((6, 3), (4, 0)):
        state = gen.start(PROMPTS, max_new_tokens=new, eos_token_id=None, cache=cache)
        while not state.is_done:
            state.step()
        if rewind:
            state.rewind(rewind)
            state.step()
        states.append(state)
    a, b = states
    assert a.sequences.tolist() == b.sequences.tolist()
    assert a.chain.cache.length == b.chain.cache.length
    assert np.array_equal(_past(a), _past(b))


def test_rewind_then_append_goes_on_alike(gen) -> None:
    """A rewind followed by ``append`` feeds several tokens on top of the cache. (On fused
    graphs GroupQueryAttention refuses that for a batch, with any cache: one row there.)"""
    prompts = PROMPTS[2:] if gen.model.signature.shared_kv else PROMPTS
    states = []
    for new, rewind in ((6, 3), (3, 0)):
        state = gen.start(prompts, max_new_tokens=new, eos_token_id=None, cache="quantized")
        while not state.is_done:
            state.step()
        if rewind:
            state.rewind(rewind)
        state.append([[7, 8]] * len(prompts))
        states.append((state, state.step().ids))
    (a, a_next), (b, b_next) = states
    assert np.array_equal(a_next, b_next)
    assert a.sequences.tolist() == b.sequences.tolist()
    assert np.array_equal(_past(a), _past(b))


def test_a_continued_chat_grows_the_cache_and_keeps_what_it_held(gen) -> None:
    first = gen.start(PROMPTS[0], max_new_tokens=3, eos_token_id=None, cache="quantized")
    while not first.is_done:
        first.step()
    cache = first.chain.cache
    held, before, nbytes = cache.length, _past(first), cache.nbytes
    follow_up = [*first.sequences[0].tolist(), *range(40, 60)]
    state = gen.next_turn(first, follow_up, max_new_tokens=4, eos_token_id=None)
    assert state is first and state.chain.cache is cache
    state.step()
    assert cache.nbytes > nbytes
    assert cache.length == len(follow_up)
    assert np.array_equal(_past(state)[:, :, :, :held], before)


def test_the_cache_is_registered_and_describes_its_graph(gen) -> None:
    assert "quantized" in gen.registry.names("kv_cache")
    state = gen.start(PROMPTS, max_new_tokens=2, cache={"name": "quantized", "bits": 4})
    assert state.chain.cache_name == "quantized"
    assert state.chain.cache.signature is gen.model.signature
    state.step()
    # its float buffers live for one forward: between steps only the codes are held
    assert state.chain.cache._step == [] and state.chain.cache._past is None


# ----------------------------------------------------------------------- default model


#: Largest gap allowed, teacher-forced through the float32 graph's static cache, of a
#: token the float32 graph picks with a quantized past: the past's rounding moves logits by
#: ~0.02 (measured: both bit widths left static's path at a 0.019 near-tie, at gap 0.021);
#: a stale or misplaced position moves them by whole logits.
KV_GAP = {"quantized": 0.5, str(Q4): 1.0}


@pytest.mark.default_model
def test_default_model_greedy_and_bytes(default_gen, reference_gen) -> None:
    """A ~40-token prompt, 32 greedy tokens. On the float32 graph (bit-stable across CPUs
    but for float rounding): dynamic and static give the float32 reference's own greedy
    tokens, every choice made by more than ``FP32_TIE``; each quantized cache's tokens are
    the reference's picks or within ``KV_GAP`` of them. On the int8 default model, every
    cache's tokens follow the float32 graph up to its near-ties (``NEAR_TIE``). The 8-bit
    cache holds <= 30% and the 4-bit one <= 20% of the float32 cache's bytes."""
    prompt = default_gen.tokenizer.encode(STORY)[:40]
    reference = reference_greedy(reference_gen, prompt, 32)
    assert min(reference.margins) > FP32_TIE, reference.margins
    out = {}
    for name, gen in (("fp32", reference_gen), ("int8", default_gen)):
        for cache in ("dynamic", "static", "quantized", Q4):
            state = gen.start(prompt, max_new_tokens=32, eos_token_id=None, cache=cache)
            while not state.is_done:
                state.step()
            out[name, str(cache)] = (state.generated(0), state.chain.cache.nbytes)
    for cache in ("dynamic", "static"):
        assert out["fp32", cache][0] == list(reference.tokens), cache
    for (name, cache), (tokens, _) in out.items():
        check = agreement(reference_gen, prompt, tokens)
        bound = KV_GAP.get(cache, 0.0) if name == "fp32" else NEAR_TIE
        assert check.largest_gap <= bound, (name, cache, check.explain())
    dynamic = out["int8", "dynamic"][1]
    assert dynamic == 2 * 30 * 3 * (40 + 31) * 64 * 4  # float32, the positions fed
    assert out["int8", "quantized"][1] <= 0.30 * dynamic
    assert out["int8", str(Q4)][1] <= 0.20 * dynamic


def _fp16_past_logits(gen, tokens: list[int], start: int = 8) -> np.ndarray:
    """Teacher-forced logits with the past merely rounded to float16 (the noise floor);
    one row on a fused graph (no position ids), as the default model is."""
    state = gen.start(
        tokens[:start], max_new_tokens=len(tokens), eos_token_id=None, cache="dynamic"
    )
    backend, logits, fed = state.chain.cache, [], 0
    for end in range(start, len(tokens) + 1):
        ids = np.asarray([tokens[fed:end]], dtype=np.int64)
        out, presents = gen.model.forward(ids, np.ones((1, end), np.int64), None, backend.inputs())
        backend.update([p.numpy().astype(np.float16).astype(np.float32) for p in presents])
        logits.append(out[0, -1].copy())
        fed = end
    return np.asarray(logits)


@pytest.mark.default_model
def test_default_model_teacher_forced_agreement(default_gen, reference_gen) -> None:
    """~150 positions of STORY. On the same weights at fp32, 8 bits agree with static at
    >= 95%. On the int4 default model they agree about as well as a past merely rounded
    to float16 does: its own activation rounding is what flips argmaxes there (module doc),
    so the bounds there are relative to that floor, measured in the same run on the same
    CPU. Thresholds are the measured values less a small margin."""
    found = {}
    for name, loaded in (("int4", default_gen), ("fp32", reference_gen)):
        gen = ortgen.load(loaded.path, threads=1)  # as measured (module doc)
        tokens = gen.tokenizer.encode(STORY)[:160]
        ref = _forced_logits(gen, tokens, "static").argmax(axis=1)
        for label, cache in (("8", "quantized"), ("4", Q4)):
            found[name, label] = float((_forced_logits(gen, tokens, cache).argmax(1) == ref).mean())
        found[name, "fp16"] = float((_fp16_past_logits(gen, tokens).argmax(1) == ref).mean())
    print("teacher-forced top-1 agreement with static:", found)
    assert found["fp32", "fp16"] == 1.0  # a fp32 graph is not noisy by itself
    assert found["fp32", "8"] >= 0.95  # measured 0.99
    assert found["fp32", "4"] >= 0.83  # 0.88
    # on the int8-activation graph the noise floor is the graph's own (a past rounded to
    # float16 flips argmaxes too, and how many depends on the CPU): 8 bits are judged
    # against that floor measured in the same run, 4 bits against their own cost at fp32
    # (CPU-stable) less what int8 noise adds. Measured (AMD EPYC Zen 3, 160 tokens): 8 bits
    # 0.967, 4 bits 0.856, float16 0.967 (fp32: 1.0, 0.895, 1.0); a broken cache: < 0.5
    assert found["int4", "8"] >= found["int4", "fp16"] - 0.05
    assert found["int4", "4"] >= found["fp32", "4"] - 0.10


# ------------------------------------------------------------------- exact recent positions


def test_residual_covering_every_position_is_exactly_the_static_cache(gen) -> None:
    """With ``residual`` at least the positions held, every past value a forward reads is
    exact: teacher-forced logits, a padded batch of mixed lengths and beam search equal
    the static cache's bit for bit (4-bit codes underneath, so without the ring they
    would not)."""
    exact = {"name": "quantized", "bits": 4, "residual": 160}
    rng = np.random.default_rng(1)
    tokens = [1, *rng.integers(3, 256, 119).tolist()]
    ref = _forced_logits(gen, tokens, "static")
    assert np.array_equal(_forced_logits(gen, tokens, exact), ref)
    assert not np.array_equal(_forced_logits(gen, tokens, Q4), ref)
    for cache in ("static", exact):
        batch = gen.generate(PROMPTS, max_new_tokens=NEW, eos_token_id=None, cache=cache)
        beams = gen.generate(
            PROMPTS[0], max_new_tokens=10, num_beams=3, eos_token_id=None, cache=cache
        )
        if cache == "static":
            expected = (batch.tokens, beams.tokens)
    assert (batch.tokens, beams.tokens) == expected


def test_residual_keeps_exactly_the_last_positions(tiny_model_dirs) -> None:
    """The past a forward reads: the last R positions are the float ones (the dynamic
    cache's), the ones before are the codes' (the cache without residual). Compared on
    layer 0, whose keys and values depend on the tokens alone: deeper layers' depend on
    the (quantized) past the layers below read."""
    gen = ortgen.load(tiny_model_dirs["llama"][1], threads=1)
    pasts = {}
    for name, cache in (
        ("dynamic", "dynamic"),
        ("codes", Q4),
        ("ring", {**Q4, "residual": 5}),
    ):
        state = gen.start(PROMPTS[2], max_new_tokens=8, eos_token_id=None, cache=cache)
        state.force()
        for token in (7, 8, 9, 10, 11, 12):  # the same tokens whatever the cache
            state.force([token])
        names = list(state.chain.cache.inputs())
        assert names[0].endswith("0.key") and names[1].endswith("0.value"), names
        pasts[name] = _past(state)[:2]  # layer 0; 9 prompt positions + the 6 forced
    assert pasts["ring"].shape[3] == 15
    assert np.array_equal(pasts["ring"][:, :, :, -5:], pasts["dynamic"][:, :, :, -5:])
    assert np.array_equal(pasts["ring"][:, :, :, :-5], pasts["codes"][:, :, :, :-5])
    assert not np.array_equal(pasts["codes"][:, :, :, -5:], pasts["dynamic"][:, :, :, -5:])


def test_residual_costs_its_float_bytes_and_is_checked(tiny_llama_gen) -> None:
    signature = tiny_llama_gen.model.signature
    per_position = 2 * signature.num_layers * signature.num_kv_heads * signature.head_dim * 4
    bytes_of = {}
    for residual in (0, 7):
        state = tiny_llama_gen.start(
            [[1, 2, 3]], max_new_tokens=2, cache={**Q4, "residual": residual}
        )
        bytes_of[residual] = state.chain.cache.nbytes
    assert bytes_of[7] - bytes_of[0] == 7 * per_position
    for bad in (-1, 2.5, "4"):
        with pytest.raises(ortgen.ConfigError, match=r"`residual` has to be a non-negative"):
            tiny_llama_gen.generate([1, 2, 3], max_new_tokens=2, cache={**Q4, "residual": bad})
