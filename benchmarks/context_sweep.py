"""Decode ms/token and prefill tok/s against context length and thread count, plus memory.

Each point runs in this one process, back to back, so the figures compare as
ratios even on a noisy machine. Writes benchmarks/results/context_sweep.json;
``benchmarks/plot.py`` turns it into the figures in docs/benchmarks.md.

    python benchmarks/context_sweep.py [--model DIR] [--lengths 32 128 512 1024] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import resource

from decode_speed import measure, write_report

import ortgen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512, 1024])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prefill-chunk", type=int, help="override Generation.prefill_chunk")
    parser.add_argument("--out", default="benchmarks/results/context_sweep.json")
    args = parser.parse_args()

    points = []
    for threads in args.threads:
        gen = ortgen.load(args.model, threads=threads)
        measure(gen, list(range(100, 132)), 4)  # warm-up
        for length in args.lengths:
            prompt = [100 + (i * 7919) % 40000 for i in range(length)]
            result = measure(gen, prompt, args.new_tokens, args.prefill_chunk)
            state = gen.start(prompt, max_new_tokens=2, eos_token_id=None)
            state.step()
            result.update(
                threads=threads, context=length, kv_cache_mb=state.chain.cache.nbytes / 1e6
            )
            points.append(result)
            print(
                f"threads {threads}  context {length:>5}"
                f"  prefill {result['prefill_tok_s']:7.0f} tok/s"
                f"  decode {result['decode_ms_per_token']:6.2f} ms/token"
                f"  in session.run {100 * result['share_in_session_run']:5.2f}%"
                f"  KV cache {result['kv_cache_mb']:6.1f} MB",
                flush=True,
            )
    report = {
        "prefill_chunk": args.prefill_chunk,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "new_tokens": args.new_tokens,
        "points": points,
    }
    print(f"peak RSS {report['peak_rss_mb']:.0f} MB")
    write_report(args.out, report)


if __name__ == "__main__":
    main()
