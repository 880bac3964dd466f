"""What giving memory back costs: one model loaded twice, A keeping its free memory
(``model.release_memory = False``), B giving it back (the default), A/B in one process.

Decode: ``ab_decode.py``'s interleaved steps (decode steps never trim, so this checks
they stay as fast). Prefill: a ``--prompt-tokens`` prompt (2,000) prefilled by A then B,
the order alternating each round, ``--rounds`` times; medians and ratios (> 1: B faster).

    python benchmarks/ab_memory.py [MODEL] [--rounds 40] [--prefills 10] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

from ab_decode import interleaved_steps

import ortgen

WORDS = ("the", "river", "ran", "past", "the", "old", "mill", "and", "the", "garden", "behind")


def prefill_seconds(gens: list, tokens: int, rounds: int) -> list[list[float]]:
    """Seconds of a ``tokens``-token prefill per generator, alternating A/B each round."""
    words = list(WORDS) * (tokens // len(WORDS) + 1)
    prompt = gens[0].tokenizer.encode(" ".join(words))[:tokens]
    times: list[list[float]] = [[], []]
    for round_ in range(rounds):
        for which in (0, 1) if round_ % 2 == 0 else (1, 0):
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
    decode = interleaved_steps(gens, args.rounds)
    prefill = prefill_seconds(gens, args.prompt_tokens, args.prefills)
    a, b = (statistics.median(t) * 1000 for t in decode)
    print(f"decode: A keeps {a:.2f} ms/step, B gives back {b:.2f} (medians of {len(decode[0])})")
    print(f"decode: B {a / b:.3f}x as fast as A")
    a, b = (statistics.median(t) * 1000 for t in prefill)
    print(f"prefill {args.prompt_tokens} tokens: A {a:.0f} ms, B {b:.0f} ms (medians of "
          f"{len(prefill[0])})")  # fmt: skip
    print(f"prefill: B {a / b:.3f}x as fast as A")


if __name__ == "__main__":
    main()
