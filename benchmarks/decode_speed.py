"""Prefill speed, decode ms/token and the share of decode time spent inside session.run.

The loop's own cost is everything outside onnxruntime: the goal is that at least
98% of decode time is inside ``session.run`` (reference: a minimal numpy loop on
the same graph spends 99% there, about 20 ms/token at 1 thread on this machine).

    python benchmarks/decode_speed.py [--model DIR] [--threads 1] [--new-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time
from pathlib import Path

import ortgen

MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


class TimedSession:
    """Wraps an onnxruntime session and adds up the time spent inside its runs."""

    def __init__(self, session) -> None:
        self._session = session
        self.seconds: list[float] = []

    def run_with_ort_values(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self._session.run_with_ort_values(*args, **kwargs)
        finally:
            self.seconds.append(time.perf_counter() - start)

    def __getattr__(self, name):
        return getattr(self._session, name)


def measure(
    gen, prompt: list[int], new_tokens: int, prefill_chunk: int | None = None
) -> dict[str, float]:
    timed = TimedSession(gen.model.session)
    gen.model.session = timed
    try:
        state = gen.start(prompt, max_new_tokens=new_tokens, eos_token_id=None)
        if prefill_chunk:
            state.prefill_chunk = prefill_chunk
        start = time.perf_counter()
        state.step()
        prefill = time.perf_counter() - start
        prefill_runs = len(timed.seconds)
        decode_start = time.perf_counter()
        while not state.is_done:
            state.step()
        decode = time.perf_counter() - decode_start
    finally:
        gen.model.session = timed._session
    decode_steps = state.steps - 1
    in_run = sum(timed.seconds[prefill_runs:])
    return {
        "prompt_tokens": len(prompt),
        "new_tokens": state.steps,
        "prefill_s": prefill,
        "prefill_tok_s": len(prompt) / prefill,
        "decode_ms_per_token": 1e3 * decode / decode_steps,
        "decode_tok_s": decode_steps / decode,
        "share_in_session_run": in_run / decode,
        "loop_overhead_ms_per_token": 1e3 * (decode - in_run) / decode_steps,
    }


def write_report(path: str, report: dict) -> None:
    """Save a benchmark's figures as JSON (benchmarks/results/ is git-ignored)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"written {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="exported model folder (default: the built-in model)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/decode_speed.json")
    args = parser.parse_args()

    start = time.perf_counter()
    gen = ortgen.load(args.model, threads=args.threads)
    load_s = time.perf_counter() - start
    prompt = gen.chat_prompt(MESSAGES)
    measure(gen, prompt, 8)  # warm-up
    runs = [measure(gen, prompt, args.new_tokens) for _ in range(args.repeats)]
    best = min(runs, key=lambda r: r["decode_ms_per_token"])
    report = {
        "model": str(gen.path),
        "threads": args.threads,
        "load_s": load_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "machine": platform.processor() or platform.machine(),
        "best": best,
        "runs": runs,
    }
    print(f"model               {report['model']}  ({args.threads} thread(s))")
    print(f"load                {load_s:.2f} s, peak RSS {report['peak_rss_mb']:.0f} MB")
    print(f"prompt              {best['prompt_tokens']} tokens, {best['new_tokens']} generated")
    print(f"prefill             {best['prefill_tok_s']:.0f} tok/s")
    for r in runs:
        print(
            f"decode              {r['decode_ms_per_token']:.2f} ms/token "
            f"({r['decode_tok_s']:.1f} tok/s), {100 * r['share_in_session_run']:.2f}% inside "
            f"session.run, loop {r['loop_overhead_ms_per_token']:.3f} ms/token"
        )
    write_report(args.out, report)


if __name__ == "__main__":
    main()
