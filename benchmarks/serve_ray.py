"""`ortgen serve --ray`: 1 and 2 Ray Serve replicas against the single-process server,
under the same load, on this machine's cores.

Three servers, one after the other (``--rounds N``: that N times over, so that a busy
minute on a shared machine shows as a round that disagrees), each started fresh on a
free port: ``ortgen serve`` (the baseline, all cores), ``ortgen serve --ray --replicas 1
--threads C`` and ``--replicas 2 --threads C/2`` (C: this machine's cores; each
replica's onnxruntime gets its share as intra-op threads, and reserves as many Ray
CPUs). Without ``--address``
each Ray server starts a Ray of its own on 127.0.0.1. Every server gets the load of
``serve_load.py`` (streaming greedy chats of exactly ``--max-tokens`` tokens at each
concurrency level, after one warm-up request); the report gives requests/s, tokens/s,
request latency (p50, p95: sending to the last chunk) and time to first token (p50) per
level, and writes JSON to ``benchmarks/results/serve_ray.json``.

    python benchmarks/serve_ray.py [--model DIR] [--levels 1 4 8 16] [--rounds 1]
                                   [--address HOST:PORT]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
from typing import Any

from serve_load import launch, measure
from sweep import write_report


def configurations(cores: int) -> list[tuple[str, list[str]]]:
    """(name, flags) of the three servers, each using all ``cores``."""
    half = max(1, cores // 2)
    ray = ["--ray", "--replicas"]
    return [
        (f"ortgen serve, {cores} threads", ["--threads", str(cores)]),
        (f"--ray, 1 replica x {cores} threads", [*ray, "1", "--threads", str(cores)]),
        (f"--ray, 2 replicas x {half} thread(s)", [*ray, "2", "--threads", str(half)]),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the default model)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--address", help="a Ray cluster for the Ray servers (default: their own)")
    parser.add_argument("--rounds", type=int, default=1, help="the three servers, N times over")
    parser.add_argument("--out", default="benchmarks/results/serve_ray.json")
    args = parser.parse_args()
    args.api_key = None
    cores = os.cpu_count() or 1
    rows = max(args.levels)
    common = ["--max-batch", str(rows), "--max-queue", "256"]
    if args.model:
        common += ["--model", args.model]
    runs: list[dict[str, Any]] = []
    for name, flags in [c for _ in range(args.rounds) for c in configurations(cores)]:
        if args.address and "--ray" in flags:
            flags = [*flags[:1], args.address, *flags[1:]]
        print(f"-- {name}", flush=True)
        started = time.perf_counter()
        server, url = launch([*common, *flags])
        ready_s = time.perf_counter() - started
        try:
            levels = asyncio.run(measure(args, url))
        finally:
            server.terminate()
            server.wait(120)
        runs.append(
            {"server": name, "flags": flags, "ready_s": round(ready_s, 1), "levels": levels}
        )
    print()
    print("| server | concurrency | requests/s | tokens/s | latency p50 s | p95 s | TTFT p50 s |")
    print("|---|---|---|---|---|---|---|")
    for run in runs:
        for level in run["levels"]:
            print(
                f"| {run['server']} | {level['concurrency']} | {level['requests_per_s']} | "
                f"{level['tokens_per_s']} | {level['latency_p50_s']} | {level['latency_p95_s']} | "
                f"{level['ttft_p50_s']} |"
            )
    report = {
        "model": args.model or "default",
        "max_tokens": args.max_tokens,
        "machine": {"platform": platform.platform(), "cpus": cores},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "runs": runs,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
