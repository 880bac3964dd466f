"""Speed and memory against context length, batch size and thread count (``ortgen bench``).

Every point is one ``ortgen.bench.run_bench`` call in this process, back to back, so the
points compare as ratios even on a noisy machine. Writes benchmarks/results/sweep.json;
``benchmarks/plot.py`` draws docs/img/sweep.png from it.

    python benchmarks/sweep.py [--model DIR] [--lengths 32 128 512 1024] [--batches 1 8]
                               [--threads 1 2] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ortgen.bench import BenchSettings, run_bench


def write_report(path: str, report: dict) -> None:
    """Save a benchmark's figures as JSON (benchmarks/results/ is git-ignored)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"written {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512, 1024])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", default="benchmarks/results/sweep.json")
    args = parser.parse_args()

    points = []
    for threads in args.threads:
        for batch in args.batches:
            for length in args.lengths:
                settings = BenchSettings(
                    model=args.model, prompt_tokens=length, new_tokens=args.new_tokens,
                    threads=threads, batch=batch, quality=False,
                )  # fmt: skip
                report = run_bench(settings)
                report.pop("greedy_tokens")
                points.append(report)
                print(
                    f"threads {threads}  batch {batch}  context {length:>5}"
                    f"  prefill {report['prefill_tokens_per_s']:7.0f} tok/s"
                    f"  decode {report['decode_tokens_per_s']:7.1f} tok/s"
                    f"  ({report['decode_ms_per_token_p50']:6.2f} ms/step)"
                    f"  in session.run {100 * report['session_run_share']:5.1f}%"
                    f"  python {report['python_ms_per_token']:.3f} ms/step"
                    f"  KV {report['kv_cache_bytes'] / 1e6:6.1f} MB",
                    flush=True,
                )
    write_report(args.out, {"new_tokens": args.new_tokens, "points": points})


if __name__ == "__main__":
    main()
