"""`ortgen serve` under load: streaming chat requests at concurrency 1, 4, 8 and 16.

Every request is a streaming chat from a fixed mix of eight questions, greedy, with
``min_new_tokens`` equal to ``max_tokens`` (64) so each makes exactly that many tokens
whatever the model would say. Per concurrency level, ``max(2 x level, 8)`` requests run
through ``level`` concurrent clients (after one warm-up request); the report gives the
generated tokens per second of the whole level (all tokens / wall time), time to first
token (p50, p95: from sending the request to its first text chunk) and each request's
own decode speed (median). It starts a server of its own (``--max-batch`` = the highest
level) unless ``--url`` names one, and writes JSON to ``benchmarks/results/``.

    python benchmarks/serve_load.py [--model DIR] [--threads N] [--levels 1 4 8 16]
    python benchmarks/serve_load.py --url http://127.0.0.1:8000 [--api-key KEY]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

import openai
from sweep import write_report

QUESTIONS = [
    "What is the capital of France?",
    "Explain photosynthesis to a child.",
    "Write a haiku about the sea.",
    "Give me three tips for learning a new language.",
    "What causes the seasons on Earth?",
    "Describe a cat in two sentences.",
    "How does a bicycle stay upright?",
    "Suggest a name for a small bakery.",
]


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """``ortgen serve --port 0`` with room for the highest level (and for the goals' 8
    requests at once: with ``--goals --levels 1`` a one-row server ran them one by one);
    its URL from stdout."""
    rows = max([*args.levels, 8] if args.goals else args.levels)
    flags = ["--max-batch", str(rows), "--max-queue", "256"]
    if args.model:
        flags += ["--model", args.model]
    if args.threads:
        flags += ["--threads", str(args.threads)]
    if args.no_prefix_sharing:
        flags.append("--no-prefix-sharing")
    if args.spin_us is not None:
        flags += ["--spin-us", str(args.spin_us)]
    return launch(flags)


def launch(flags: list[str], **popen: Any) -> tuple[subprocess.Popen, str]:
    """``python -m ortgen.cli serve --port 0 FLAGS`` (``popen``: more ``Popen`` arguments,
    e.g. ``env``, ``stderr``); it and its URL, read from the line it prints when listening."""
    command = [sys.executable, "-m", "ortgen.cli", "serve", "--port", "0", *flags]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, **popen)
    assert server.stdout is not None
    for line in server.stdout:
        if " at http://" in line:
            return server, line.split(" at ", 1)[1].strip().removesuffix("/v1")
    raise SystemExit(f"the server did not start (status {server.wait()})")


async def one_request(client: openai.AsyncOpenAI, question: str, tokens: int) -> dict[str, Any]:
    """One streamed chat: seconds to the first text, to the end, and tokens made."""
    started = time.perf_counter()
    first = None
    made = 0
    stream = await client.chat.completions.create(
        model="served",
        messages=[{"role": "user", "content": question}],
        max_tokens=tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"min_new_tokens": tokens},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first is None:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            made = chunk.usage.completion_tokens
    total = time.perf_counter() - started
    first = total if first is None else first
    decode = (made - 1) / (total - first) if made > 1 and total > first else 0.0
    return {"ttft_s": first, "total_s": total, "tokens": made, "decode_tokens_per_s": decode}


async def run_level(
    client: openai.AsyncOpenAI, concurrency: int, count: int, tokens: int
) -> dict[str, Any]:
    """``count`` requests through ``concurrency`` workers taking the next question each."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(QUESTIONS[i % len(QUESTIONS)])
    results: list[dict[str, Any]] = []

    async def worker() -> None:
        while not queue.empty():
            results.append(await one_request(client, queue.get_nowait(), tokens))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    ttft = sorted(r["ttft_s"] for r in results)
    latency = sorted(r["total_s"] for r in results)
    made = sum(r["tokens"] for r in results)
    return {
        "concurrency": concurrency,
        "requests": count,
        "wall_s": round(wall, 3),
        "tokens": made,
        "tokens_per_s": round(made / wall, 1),
        "requests_per_s": round(count / wall, 2),
        "latency_p50_s": round(statistics.median(latency), 3),
        "latency_p95_s": round(latency[min(len(latency) - 1, int(0.95 * len(latency)))], 3),
        "ttft_p50_s": round(statistics.median(ttft), 3),
        "ttft_p95_s": round(ttft[min(len(ttft) - 1, int(0.95 * len(ttft)))], 3),
        "request_decode_tokens_per_s_p50": round(
            statistics.median(r["decode_tokens_per_s"] for r in results), 1
        ),
    }


async def measure(args: argparse.Namespace, url: str) -> list[dict[str, Any]]:
    client = openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key=args.api_key or "unused", max_retries=0, timeout=600
    )
    await one_request(client, QUESTIONS[0], args.max_tokens)  # warm-up
    levels = []
    for level in args.levels:
        result = await run_level(client, level, max(2 * level, 8), args.max_tokens)
        levels.append(result)
        print(
            f"concurrency {level:>3}: {result['tokens_per_s']:>7.1f} tok/s  "
            f"TTFT p50 {result['ttft_p50_s']:.3f} s  p95 {result['ttft_p95_s']:.3f} s  "
            f"per-request {result['request_decode_tokens_per_s_p50']:.1f} tok/s",
            flush=True,
        )
    return levels


async def goals(args: argparse.Namespace, url: str) -> dict[str, Any]:
    """The server's two goals, measured in one run: the same 8 requests one after
    another, then all at once (the wall-time ratio); and the time to first token of a
    short prompt on an idle server, then while 7 long streams decode (medians of 5)."""
    client = openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key=args.api_key or "unused", max_retries=0, timeout=600
    )
    await one_request(client, QUESTIONS[0], args.max_tokens)  # warm-up
    started = time.perf_counter()
    for question in QUESTIONS:
        await one_request(client, question, args.max_tokens)
    one_by_one = time.perf_counter() - started
    started = time.perf_counter()
    await asyncio.gather(*(one_request(client, q, args.max_tokens) for q in QUESTIONS))
    together = time.perf_counter() - started
    short = "Hi!"
    idle = [(await one_request(client, short, 1))["ttft_s"] for _ in range(5)]
    busy = []
    for _ in range(5):
        long = [asyncio.ensure_future(one_request(client, q, 200)) for q in QUESTIONS[:7]]
        await asyncio.sleep(1.0)  # the seven are past their prefill, decoding
        busy.append((await one_request(client, short, 1))["ttft_s"])
        await asyncio.gather(*long)
    result = {
        "eight_one_by_one_s": round(one_by_one, 2),
        "eight_at_once_s": round(together, 2),
        "speedup": round(one_by_one / together, 2),
        "ttft_idle_s": round(statistics.median(idle), 3),
        "ttft_with_7_decoding_s": round(statistics.median(busy), 3),
    }
    result["ttft_ratio"] = round(result["ttft_with_7_decoding_s"] / result["ttft_idle_s"], 2)
    print(
        f"8 requests: one by one {one_by_one:.2f} s, at once {together:.2f} s "
        f"({result['speedup']}x); TTFT idle {result['ttft_idle_s']} s, with 7 decoding "
        f"{result['ttft_with_7_decoding_s']} s ({result['ttft_ratio']}x)",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--api-key", help="the server's API key, if it has one")
    parser.add_argument("--model", help="model folder for the started server (default model)")
    parser.add_argument("--threads", type=int, help="onnxruntime threads of the started server")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", default="benchmarks/results/serve_load.json")
    parser.add_argument(
        "--goals", action="store_true", help="also: 8 at once vs one by one; TTFT under load"
    )
    parser.add_argument(
        "--no-prefix-sharing",
        action="store_true",
        help="start the server with --no-prefix-sharing (every prompt prefilled whole)",
    )
    parser.add_argument("--spin-us", type=int, help="the server's --spin-us (default: its own)")
    args = parser.parse_args()
    server = None
    url = args.url
    if url is None:
        server, url = start_server(args)
    try:
        levels = asyncio.run(measure(args, url))
        goal = asyncio.run(goals(args, url)) if args.goals else None
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)
    report = {
        "url": url if args.url else None,
        "model": args.model or "default",
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "levels": levels,
        "goals": goal,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
