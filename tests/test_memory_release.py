"""Memory given back (``ortgen.model.memory``, the ``slots`` cache's ``compact``): a
prefill's last chunk runs with onnxruntime's arena shrinkage and the heap is trimmed
after it, never after a decode step;
when the last row of a served batch leaves, the slots cache keeps one prefix in buffers
of the fewest positions and the engine trims; ``release_memory = False`` and
``compact=False`` (``ortgen serve --keep-memory``) keep everything. RSS itself is noisy
and is the benchmark's (``benchmarks/soak_memory.py``), not asserted here."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import numpy as np
import pytest

import ortgen
from ortgen.loop import generate as generate_module
from ortgen.model import memory, session
from ortgen.plugins.kv_slots import SlotCache
from ortgen.serve import engine as engine_module
from tests.server_helpers import running_engine
from tests.tiny_models import export_tiny


@pytest.fixture(scope="module")
def fused(tiny_root: Path):
    folder = export_tiny("llama", tiny_root / "memory", with_tokenizer=True, graph="fused")
    return ortgen.load(folder, threads=1)


class _Spy:
    """Stands in for the session: records each run, as ``shrink`` when its run options
    ask onnxruntime to shrink the CPU arena (read back through onnxruntime's own API)."""

    def __init__(self, real, events: list[str]) -> None:
        self.real, self.events = real, events

    def run_with_iobinding(self, binding, *args) -> None:
        self.real.run_with_iobinding(binding, *args)
        options = args[0] if args else None  # None: onnxruntime's default run options
        shrinks = options is not None and options.get_run_config_entry(memory.SHRINK_KEY) == "cpu:0"
        self.events.append("shrink" if shrinks else "run")

    def __getattr__(self, name: str):
        return getattr(self.real, name)


def _events(gen, monkeypatch, prompt: list[int], new: int) -> list[str]:
    events: list[str] = []
    monkeypatch.setattr(session, "trim_heap", lambda: events.append("trim"))
    monkeypatch.setattr(gen.model, "session", _Spy(gen.model.session, events))
    gen.generate([prompt], max_new_tokens=new, eos_token_id=None)
    return events


def test_memory_is_given_back_after_a_prefill_once_and_never_after_a_decode_step(
    fused, monkeypatch
) -> None:
    monkeypatch.setattr(generate_module, "PREFILL_CHUNK", 8)  # each Generation reads it
    prompt = fused.tokenizer.encode("a prompt of twenty chars")[:20]
    events = _events(fused, monkeypatch, prompt, 4)
    # 20 tokens in chunks of 8: 8, 8, 4, the heap trimmed after the last; 3 decode steps
    assert events == ["run", "run", "shrink", "trim", "run", "run", "run"]


def test_release_memory_false_never_trims(fused, monkeypatch) -> None:
    monkeypatch.setattr(fused.model, "release_memory", False)
    prompt = fused.tokenizer.encode("another prompt")
    assert _events(fused, monkeypatch, prompt, 3) == ["run"] * 3


def test_trim_heap_reaches_glibc() -> None:
    # this suite runs on glibc Linux: the call must find malloc_trim, not pass silently
    assert memory.trim_heap() is True


# -- the slots cache when the last row leaves ---------------------------------------------


def _cache(gen, compact: bool) -> SlotCache:
    ctx = gen.context([[0]], gen.resolve_config({}).config)
    ctx = dataclasses.replace(ctx, batch_size=3, max_length=8)
    cache = SlotCache(ctx=ctx, capacity=8, compact=compact)
    cache.add_rows(3)
    cache._grow(64)  # a long row made it grow, and it stays grown
    for slot, length in enumerate([5, 12, 3]):
        cache.note_row(slot, list(range(100 * slot, 100 * slot + length)), 0)
        for buffer in cache._buffers:
            buffer[slot, :, :length] = slot + 1
    cache._length = 12
    return cache


def test_slots_keep_the_longest_prefix_of_the_rows_leaving_in_fewer_positions(fused) -> None:
    cache = _cache(fused, compact=True)
    cache.keep_rows(np.asarray([], dtype=np.int64))
    assert cache.active == 0
    assert cache._held == [tuple(range(100, 112)), (), ()]  # slot 1's 12 tokens, now in 0
    assert {b.shape[2] for b in cache._buffers} == {16}  # 8 doubled once holds 12
    assert all((b[0, :, :12] == 2).all() for b in cache._buffers)
    assert cache._length == 12
    # the next request starts from it, as it would have from slot 1
    cache.add_rows(1)
    assert cache.reuse_row(0, [*range(100, 112), 7, 7]) == 12


def test_keep_bytes_cuts_the_kept_prefix_and_the_next_request_shares_what_is_left(
    fused,
) -> None:
    cache = _cache(fused, compact=True)
    cache.keep_bytes = 7 * cache.position_bytes + cache.position_bytes // 2  # 7.5 positions
    signature = fused.model.signature
    per_position = len(signature.past_inputs) * signature.num_kv_heads * signature.head_dim
    assert cache.position_bytes == per_position * np.dtype(signature.kv_dtype).itemsize
    cache.keep_rows(np.asarray([], dtype=np.int64))
    assert cache._held == [tuple(range(100, 107)), (), ()]  # slot 1's first 7 of 12 tokens
    assert {b.shape[2] for b in cache._buffers} == {8}  # the fewest positions holding 7
    assert all((b[0, :, :7] == 2).all() for b in cache._buffers)
    assert cache._length == 7
    cache.add_rows(1)
    assert cache.reuse_row(0, [*range(100, 112), 7, 7]) == 7


def test_keep_bytes_must_be_a_non_negative_integer(fused) -> None:
    ctx = fused.context([[0]], fused.resolve_config({}).config)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=f"keep_bytes must be a non-negative integer.*{bad}"):
            SlotCache(ctx=ctx, keep_bytes=bad)  # type: ignore[arg-type]


def test_compact_false_keeps_every_slot_and_the_grown_buffers(fused) -> None:
    cache = _cache(fused, compact=False)
    cache.keep_rows(np.asarray([], dtype=np.int64))
    assert [len(held) for held in cache._held] == [5, 12, 3]
    assert {b.shape[2] for b in cache._buffers} == {64}


def test_compact_must_be_a_bool(fused) -> None:
    ctx = fused.context([[0]], fused.resolve_config({}).config)
    with pytest.raises(ValueError, match="compact must be true or false, got 'yes'"):
        SlotCache(ctx=ctx, compact="yes")  # type: ignore[arg-type]


def _serve(gen, monkeypatch, release: bool, jobs: list[tuple[list[int], dict]]):
    trims: list[int] = []
    monkeypatch.setattr(engine_module, "trim_heap", lambda: trims.append(1))
    monkeypatch.setattr(engine_module, "SLOT_POSITIONS", 16)  # the tiny model's context: 128

    async def one(engine, prompt, settings) -> list[int]:
        handle = engine.submit(prompt, settings)
        return [piece.token async for piece in handle.pieces()]

    async def main(engine):
        return [await one(engine, p, s) for p, s in jobs]

    with running_engine(gen, max_batch=2, release_memory=release) as engine:
        got = asyncio.run(main(engine))
        cache = engine.open_batch().chain.cache
        reused = engine.stats.reused_prompt_tokens
    return got, trims, cache, reused


def test_an_idle_engine_compacts_and_trims_and_answers_as_alone(fused, monkeypatch) -> None:
    long = fused.tokenizer.encode("y" * 100)  # the buffers grow past 100 positions
    short = fused.tokenizer.encode("a short one")
    settings = {"max_new_tokens": 4, "eos_token_id": None}
    jobs = [(long, settings), (short, settings), (short + fused.tokenizer.encode("!?"), settings)]
    got, trims, cache, reused = _serve(fused, monkeypatch, True, jobs)
    for (prompt, s), tokens in zip(jobs, got, strict=True):
        assert tokens == fused.generate([prompt], **s).tokens[0]
    assert len(trims) == 3  # each time the batch emptied
    assert {b.shape[2] for b in cache._buffers} == {16 if len(short) + 2 <= 16 else 32}
    assert cache._held[1:] == [()]
    assert reused >= len(short) - 1  # the third request started from the second's prompt

    got, trims, cache, reused = _serve(fused, monkeypatch, False, jobs)
    assert trims == [] and cache.compact is False
    assert all(b.shape[2] > 100 for b in cache._buffers)  # grown for the long prompt


def test_an_idle_engine_keeps_at_most_idle_keep_bytes_and_answers_as_alone(
    fused, monkeypatch
) -> None:
    first = fused.tokenizer.encode("z " * 40)  # longer than the cap
    follow = first + fused.tokenizer.encode(" and then?")
    settings = {"max_new_tokens": 4, "eos_token_id": None}
    probe = _cache(fused, compact=True)
    monkeypatch.setattr(engine_module, "IDLE_KEEP_BYTES", 10 * probe.position_bytes)
    jobs = [(first, settings), (follow, settings)]
    got, _, cache, reused = _serve(fused, monkeypatch, True, jobs)
    for (prompt, s), tokens in zip(jobs, got, strict=True):
        assert tokens == fused.generate([prompt], **s).tokens[0]
    assert cache.keep_bytes == 10 * cache.position_bytes
    assert len(cache._held[0]) == 10  # the second prompt's first 10 tokens, kept idle
    assert tuple(follow[:10]) == cache._held[0]
    assert reused == 10  # the second request started from the first's first 10 tokens


def test_without_the_arena_a_prefill_trims_without_shrinking_and_answers_alike(
    fused, monkeypatch
) -> None:
    plain = ortgen.load(fused.path, threads=1, memory_arena=False)
    assert plain.model.session.get_session_options().enable_cpu_mem_arena is False
    assert fused.model.session.get_session_options().enable_cpu_mem_arena is True
    monkeypatch.setattr(generate_module, "PREFILL_CHUNK", 8)
    prompt = plain.tokenizer.encode("a prompt of twenty chars")[:20]
    # onnxruntime refuses the shrink run option without an arena: a plain run, then the trim
    assert _events(plain, monkeypatch, prompt, 4) == ["run", "run", "run", "trim", *["run"] * 3]
    settings = {"max_new_tokens": 6, "eos_token_id": None}
    assert (
        plain.generate([prompt], **settings).tokens == fused.generate([prompt], **settings).tokens
    )


def test_one_heap_reaches_glibc() -> None:
    assert memory.one_heap() is True


def test_slot_buffers_are_anonymous_maps_of_their_own(fused) -> None:
    # np.zeros (calloc) on a heap block writes, and so maps, every page; a map of its own
    # is zero without being written and is unmapped whole when freed
    import mmap

    from ortgen.plugins.caches import lazy_zeros

    def owner(array: np.ndarray) -> object:
        base: object = array
        while isinstance(base, np.ndarray):
            base = base.base
        return base.obj if isinstance(base, memoryview) else base

    cache = _cache(fused, compact=True)
    assert all(isinstance(owner(b), mmap.mmap) for b in cache._buffers)
    zeros = lazy_zeros((2, 3, 1 << 16), np.dtype(np.float32))
    assert zeros.flags.writeable and zeros.shape == (2, 3, 1 << 16) and not zeros.any()
    assert lazy_zeros((0, 3), np.dtype(np.float32)).shape == (0, 3)


@pytest.mark.parametrize("keep", [False, True])
def test_ortgen_serve_keep_memory_reaches_the_model_and_the_cache(fused, keep) -> None:
    from ortgen.cli.parser import build_parser
    from ortgen.serve.model_pool import ModelSource
    from ortgen.serve.server import _loader

    flags = ["serve", "--threads", "1", *(["--keep-memory"] if keep else [])]
    args = build_parser().parse_args(flags)
    args.cache = None  # what cmd_serve sets from --cache
    served = _loader(args, [])(ModelSource("m", fused.path), None)
    try:
        assert served.gen.model.release_memory is not keep
        assert served.engine.release_memory is not keep
        assert served.engine.open_batch().chain.cache.compact is not keep
        options = served.gen.model.session.get_session_options()
        assert options.enable_cpu_mem_arena is keep and served.gen.model.memory_arena is keep
        kept = served.engine.open_batch().chain.cache.keep_bytes
        assert kept == (None if keep else engine_module.IDLE_KEEP_BYTES)
    finally:
        served.engine.shutdown()
