"""`ortgen run`'s local engine against calling ``generate`` directly on the same batches.

The engine adds reading and checking rows, sorting by length, per-row usage, writing and
fsync-ing every batch's result lines; all of that must stay small beside generation
(goal: the job's tokens/s at least 0.9x the direct calls'). Both sides generate the same
batches (the rows sorted by prompt length, ``--batch-size`` at a time), greedy with EOS
ignored so every row makes ``--new-tokens`` tokens. Rounds alternate (direct, job, ...)
so a neighbour's load on a shared machine hits both; the best round of each is compared.

    python benchmarks/run_throughput.py [--model DIR] [--rows 48] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from importlib.resources import files
from pathlib import Path

from sweep import write_report

import ortgen
from ortgen.jobs import run_job


def prompts(count: int) -> list[str]:
    """``count`` text prompts of 8 to 64 words, cut from the evaluation text."""
    words = files("ortgen").joinpath("data/eval_text.txt").read_text(encoding="utf-8").split()
    out, start = [], 0
    for i in range(count):
        length = 8 + (i * 37) % 57
        out.append(" ".join(words[start : start + length]))
        start = (start + length) % (len(words) - 64)
    return out


def direct(gen, rows: list[str], batch_size: int, settings: dict) -> tuple[int, float]:
    """Tokens and seconds of ``generate`` on the batches the job forms."""
    ordered = sorted(rows, key=lambda text: len(gen.tokenizer.encode(text)))
    started = time.perf_counter()
    tokens = 0
    for i in range(0, len(ordered), batch_size):
        out = gen.generate(ordered[i : i + batch_size], **settings)
        tokens += sum(len(t) for t in out.tokens)
    return tokens, time.perf_counter() - started


def job(gen, source: Path, folder: Path, batch_size: int, settings: dict) -> tuple[int, float]:
    """Tokens and seconds of a whole ``run_job`` (a fresh output each time)."""
    out = folder / f"out-{time.monotonic_ns()}.jsonl"
    started = time.perf_counter()
    summary = run_job(gen, source, out, batch_size=batch_size, settings=settings, progress=None)
    return summary.tokens, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="exported model folder (default: the built-in model)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/run_throughput.json")
    args = parser.parse_args()
    gen = ortgen.load(args.model, threads=args.threads)
    settings = {"max_new_tokens": args.new_tokens, "eos_token_id": None}
    rows = prompts(args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        source = folder / "rows.jsonl"
        source.write_text("".join(json.dumps({"prompt": r}) + "\n" for r in rows))
        gen.generate(rows[: args.batch_size], **settings)  # warm-up: first-run allocations
        best = {"direct": 0.0, "job": 0.0}
        for round_ in range(args.rounds):
            for name, measure in (
                ("direct", lambda: direct(gen, rows, args.batch_size, settings)),
                ("job", lambda: job(gen, source, folder, args.batch_size, settings)),
            ):
                tokens, seconds = measure()
                rate = tokens / seconds
                best[name] = max(best[name], rate)
                print(
                    f"round {round_ + 1} {name:6s} {tokens} tokens "
                    f"{seconds:6.2f} s {rate:7.1f} tok/s"
                )
    ratio = best["job"] / best["direct"]
    print(
        f"best: direct {best['direct']:.1f} tok/s, job {best['job']:.1f} tok/s, "
        f"ratio {ratio:.3f} (goal >= 0.9)"
    )
    write_report(
        args.out,
        {
            "model": str(gen.path),
            "rows": args.rows,
            "batch_size": args.batch_size,
            "new_tokens": args.new_tokens,
            "direct_tokens_per_s": best["direct"],
            "job_tokens_per_s": best["job"],
            "ratio": ratio,
        },
    )


if __name__ == "__main__":
    main()
