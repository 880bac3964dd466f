"""Decode speed of two model folders, A/B in one process: steps interleaved in chunks.

Separate ``ortgen bench`` runs on a shared VM drift by 10-20% from one minute to the next,
more than the change being measured. Here both models decode the same greedy request in
one process, 8 steps of one then 8 of the other (the order alternating), so drift hits
both alike; the medians of their step times give the ratio.

    python benchmarks/ab_decode.py OLD_MODEL NEW_MODEL [--rounds 40] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import ortgen

PROMPT = "Write a long story about a lighthouse keeper who finds a strange map."
CHUNK = 8


def decode_states(gens: list, rounds: int, start=None) -> list:
    """One greedy request of ``PROMPT`` per generator, prefilled (untimed), with room
    for ``rounds`` chunks of steps; ``start(gen, prompt, new)`` makes one (default
    ``gen.start``)."""
    prompt = gens[0].tokenizer.encode(PROMPT)
    new = rounds * CHUNK + 1
    start = start or (lambda gen, ids, n: gen.start([ids], max_new_tokens=n, eos_token_id=None))
    states = [start(gen, prompt, new) for gen in gens]
    for state in states:
        state.step()  # the prefill, not timed
    return states


def interleaved_steps(states: list, rounds: int) -> list[list[float]]:
    """Seconds of each decode step of two requests, ``CHUNK`` steps of one then of the
    other (the order alternating each round)."""
    times: list[list[float]] = [[], []]
    for round_ in range(rounds):
        for which in (0, 1) if round_ % 2 == 0 else (1, 0):
            for _ in range(CHUNK):
                started = time.perf_counter()
                states[which].step()
                times[which].append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="model folder A (the baseline)")
    parser.add_argument("b", help="model folder B")
    parser.add_argument("--rounds", type=int, default=40, help="chunks of 8 steps per model")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    gens = [ortgen.load(path, threads=args.threads) for path in (args.a, args.b)]
    times = interleaved_steps(decode_states(gens, args.rounds), args.rounds)
    a, b = (statistics.median(t) * 1000 for t in times)
    print(f"A {args.a}: {a:.2f} ms/step (median of {len(times[0])})")
    print(f"B {args.b}: {b:.2f} ms/step (median of {len(times[1])})")
    print(f"B decodes {a / b:.3f}x as fast as A")


if __name__ == "__main__":
    main()
