"""Speed of two memory settings of a whole process, A/B: one worker process per side
(settings such as glibc's ``mallopt`` hold for a whole process, so ``ab_memory.py``'s
one-process A/B cannot compare them), driven in turn so both see the same machine.

A: the settings as before (``ortgen.load``'s defaults, glibc's); B: ``ortgen serve``'s
(onnxruntime's CPU arena off: ``memory_arena=False``; every thread on glibc's main heap:
``ortgen.model.memory.one_heap``). Both give memory back after a prefill. Decode: one
greedy request per side, ``CHUNK`` steps of one then of the other (the order alternating
each round); prefill: a ``--prompt-tokens`` prompt (2,000) per side, alternating.
Medians and ratios (> 1: B faster).

    python benchmarks/ab_settings.py [--threads 1] [--rounds 40] [--prefills 10]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from ab_memory import print_ab

WORDS = ("the", "river", "ran", "past", "the", "old", "mill", "and", "the", "garden", "behind")
CHUNK = 8


def worker(args: argparse.Namespace) -> None:
    """One side: load the model, then answer ``decode`` and ``prefill`` commands."""
    import ortgen
    from ortgen.model import memory

    one_heap = args.worker == "B" and memory.one_heap()
    gen = ortgen.load(args.model, threads=args.threads, memory_arena=args.worker == "A")
    words = list(WORDS) * (args.prompt_tokens // len(WORDS) + 1)
    long_prompt = gen.tokenizer.encode(" ".join(words))[: args.prompt_tokens]
    short = gen.tokenizer.encode(" ".join(WORDS))
    state = gen.start([short], max_new_tokens=args.rounds * CHUNK + 2, eos_token_id=None)
    state.step()  # the prefill, not timed
    arena = gen.model.session.get_session_options().enable_cpu_mem_arena
    print(json.dumps({"arena": arena, "one_heap": one_heap}), flush=True)
    for line in sys.stdin:
        if line.startswith("decode"):
            times = []
            for _ in range(CHUNK):
                started = time.perf_counter()
                state.step()
                times.append(time.perf_counter() - started)
            print(json.dumps(times), flush=True)
        elif line.startswith("prefill"):
            one = gen.start([long_prompt], max_new_tokens=1, eos_token_id=None)
            started = time.perf_counter()
            one.step()
            print(json.dumps([time.perf_counter() - started]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default model)")
    parser.add_argument("--rounds", type=int, default=40, help="decode: chunks of 8 steps")
    parser.add_argument("--prefills", type=int, default=10, help="prefills per side (10)")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--worker", choices=("A", "B"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    command = [sys.executable, __file__, "--rounds", str(args.rounds), "--threads",
               str(args.threads), "--prompt-tokens", str(args.prompt_tokens)]  # fmt: skip
    if args.model:
        command += ["--model", args.model]
    sides = [
        subprocess.Popen(
            [*command, "--worker", side], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for side in ("A", "B")
    ]
    for name, side in zip("AB", sides, strict=True):
        assert side.stdout is not None
        settings = json.loads(side.stdout.readline())
        print(f"{name}: onnxruntime's CPU arena {'on' if settings['arena'] else 'off'}, "
              f"{'one heap' if settings['one_heap'] else 'an arena per thread'}")  # fmt: skip

    def ask(which: int, command: str) -> list[float]:
        side = sides[which]
        assert side.stdin is not None and side.stdout is not None
        side.stdin.write(command + "\n")
        side.stdin.flush()
        return json.loads(side.stdout.readline())

    decode: list[list[float]] = [[], []]
    prefill: list[list[float]] = [[], []]
    for round_ in range(max(args.rounds, args.prefills)):
        order = (0, 1) if round_ % 2 == 0 else (1, 0)
        for which in order:
            if round_ < args.rounds:
                decode[which] += ask(which, "decode")
        for which in order:
            if round_ < args.prefills:
                prefill[which] += ask(which, "prefill")
    for side in sides:
        assert side.stdin is not None
        side.stdin.close()
        side.wait()
    print_ab(decode, prefill, args.prompt_tokens)


if __name__ == "__main__":
    main()
