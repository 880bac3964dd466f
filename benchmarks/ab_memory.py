"""What giving memory back costs: one model loaded twice, A as before (its memory kept:
``model.release_memory = False``, its cache's buffers ``np.zeros``), B giving it back
(the default: the heap trimmed and the arena shrunk after a prefill, the cache's buffers
anonymous maps of their own), A/B in one process.

Decode: ``ab_decode.py``'s interleaved steps. Prefill: a ``--prompt-tokens`` prompt
(2,000) prefilled by A then B, the order alternating each round, ``--prefills`` times;
medians and ratios (> 1: B faster).

    python benchmarks/ab_memory.py [MODEL] [--rounds 40] [--prefills 10] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator

import numpy as np
from ab_decode import decode_states, interleaved_steps

import ortgen
from ortgen.plugins import caches

WORDS = ("the", "river", "ran", "past", "the", "old", "mill", "and", "the", "garden", "behind")


@contextlib.contextmanager
def as_before(which: int) -> Iterator[None]:
    """For A (``which`` 0): caches made meanwhile take ``np.zeros`` buffers, as before."""
    lazy = caches.lazy_zeros
    if which == 0:
        caches.lazy_zeros = lambda shape, dtype: np.zeros(shape, dtype)
    try:
        yield
    finally:
        caches.lazy_zeros = lazy


def starter(gens: list):
    """``ab_decode.decode_states``'s ``start``: each side's cache made as it makes it."""

    def one(gen, ids: list[int], count: int):
        with as_before(gens.index(gen)):
            return gen.start([ids], max_new_tokens=count, eos_token_id=None)

    return one


def prefill_seconds(gens: list, tokens: int, rounds: int) -> list[list[float]]:
    """Seconds of a ``tokens``-token prefill per generator, alternating A/B each round."""
    words = list(WORDS) * (tokens // len(WORDS) + 1)
    prompt = gens[0].tokenizer.encode(" ".join(words))[:tokens]
    times: list[list[float]] = [[], []]
    for round_ in range(rounds):
        for which in (0, 1) if round_ % 2 == 0 else (1, 0):
            with as_before(which):
                state = gens[which].start([prompt], max_new_tokens=1, eos_token_id=None)
            started = time.perf_counter()
            state.step()  # the prefill and the first token
            times[which].append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="model folder (default model)")
    parser.add_argument("--rounds", type=int, default=40, help="decode: chunks of 8 steps")
    parser.add_argument("--prefills", type=int, default=10, help="prefills per side (10)")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    gens = [ortgen.load(args.model, threads=args.threads) for _ in range(2)]
    gens[0].model.release_memory = False
    gens[1].model.release_memory = True
    decode = interleaved_steps(decode_states(gens, args.rounds, starter(gens)), args.rounds)
    prefill = prefill_seconds(gens, args.prompt_tokens, args.prefills)
    print_ab(decode, prefill, args.prompt_tokens)


def print_ab(decode: list[list[float]], prefill: list[list[float]], prompt_tokens: int) -> None:
    """The A/B's medians and ratios (B over A): decode seconds per step, prefill seconds."""
    a, b = (statistics.median(t) * 1000 for t in decode)
    print(f"decode: A (as before) {a:.2f} ms/step, B {b:.2f} (medians of {len(decode[0])})")
    print(f"decode: B {a / b:.3f}x as fast as A")
    a, b = (statistics.median(t) * 1000 for t in prefill)
    print(f"prefill {prompt_tokens} tokens: A {a:.0f} ms, B {b:.0f} ms (medians of "
          f"{len(prefill[0])})")  # fmt: skip
    print(f"prefill: B {a / b:.3f}x as fast as A")


if __name__ == "__main__":
    main()
