"""`ortgen serve` memory over a long run: RSS after N mixed requests against after the first.

Starts ``ortgen serve`` (the default model unless ``--model``; 127.0.0.1, a free port, an
API key), sends it one small request (a short chat question, free, ``n`` 1: the RSS
after it is the baseline), then ``--requests`` requests through ``--clients`` client
threads, each drawn at random (seeded by ``--seed``):

* a prompt of 16 to ``--max-prompt-tokens`` tokens (log-uniform: as many of 16-125 as of
  250-2,000; random words, so no two prompts share more than the chat template's header
  and the prefix cache cannot hide the prefill), as chat or completions;
* ``n`` from 1 to 4 (sampled with a seed when ``n`` > 1; greedy or sampled otherwise);
* free (half), ``response_format`` ``json_schema`` (a quarter, chat) or a ``regex``
  (a quarter);
* 4 to ``--max-tokens`` new tokens, streamed or not.

Every answer must be well formed (soak.py's checks: the choices, finish reasons,
usage). The server's RSS (``VmRSS`` of ``/proc/PID/status``) is read after the first
request, after every ``--every`` requests answered, and at the end (``--settle`` seconds
after the last answer: the server idle); its peak is the kernel's ``VmHWM``; its parts
``RssAnon``, ``RssShmem`` and ``RssFile`` (anonymous memory, the KV slot buffers'
shared maps, file pages) after the first request and at the end, and the ratio without
the file pages (clean page cache). Goal: RSS at the end <= ``--bound`` (1.5) x RSS after
the first request; the script prints PASS or FAIL and exits 1 on FAIL.

    python benchmarks/soak_memory.py [--requests 1000] [--clients 4] [--every 50]
        [--max-prompt-tokens 2000] [--max-tokens 16] [--server-flag=--keep-memory]
        [--json benchmarks/results/soak_memory.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any

from serve_load import QUESTIONS, launch
from soak import Soak, generate, read_rss
from sweep import write_report

BOUND = 1.5
#: the parts of VmRSS: anonymous memory (what the process can give back), shared memory
#: (the KV slot buffers: anonymous maps of their own, shared) and file pages (the model's
#: and the libraries' code and data, clean, shared with the page cache)
PARTS = ("RssAnon", "RssShmem", "RssFile")
#: the words prompts are drawn from (any English words: only their count matters)
WORDS = (
    "river",
    "mountain",
    "window",
    "garden",
    "silver",
    "morning",
    "quiet",
    "engine",
    "paper",
    "bridge",
    "orange",
    "winter",
    "travel",
    "letter",
    "market",
    "candle",
    "forest",
    "signal",
    "harbor",
    "pocket",
    "thunder",
    "meadow",
    "lantern",
    "copper",
    "velvet",
    "canyon",
    "pepper",
    "saddle",
    "violin",
    "marble",
    "anchor",
    "feather",
    "tunnel",
    "cotton",
    "meteor",
    "basket",
    "island",
    "ladder",
    "planet",
    "rocket",
    "shadow",
    "statue",
    "temple",
    "valley",
    "wagon",
    "zebra",
    "almond",
    "breeze",
    "castle",
    "dragon",
    "falcon",
    "glacier",
    "hammer",
    "jungle",
    "kettle",
)
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}},
    "required": ["answer", "score"],
}
REGEXES = [r"[0-9]{1,6}", r"(yes|no), because [a-z ]{1,40}", r"[A-Z][a-z]+( [a-z]+){0,8}\."]


def vm_status(pid: int, field: str) -> int | None:
    """A ``/proc/PID/status`` field in bytes (``VmRSS``, ``VmHWM``); None once gone."""
    if field == "VmRSS":
        return read_rss(pid)
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def words_per_token(soak: Soak) -> float:
    """How many of ``WORDS`` make one token, from the server's own ``/tokenize``."""
    text = " ".join(WORDS * 20)
    conn = soak.connect(60)
    try:
        conn.request("POST", "/tokenize", json.dumps({"prompt": text}).encode(), soak.headers())
        answer = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    return len(WORDS) * 20 / len(answer["tokens"])


def request_body(
    rng: random.Random, max_prompt: int, max_tokens: int, ratio: float
) -> tuple[str, str, dict[str, Any]]:
    """(kind, route, body) of one request of the mix."""
    tokens = round(math.exp(rng.uniform(math.log(16), math.log(max_prompt))))
    text = " ".join(rng.choice(WORDS) for _ in range(max(1, int(tokens * ratio))))
    n = rng.randint(1, 4)
    pick = rng.random()
    mode = "free" if pick < 0.5 else "json_schema" if pick < 0.75 else "regex"
    chat = mode == "json_schema" or rng.random() < 0.6
    body: dict[str, Any] = {"model": "x", "max_tokens": rng.randint(4, max_tokens), "n": n}
    if n > 1 or rng.random() < 0.5:
        body.update(temperature=0.8, top_p=0.95, seed=rng.randrange(1 << 30))
    else:
        body["temperature"] = 0
    body["stream"] = rng.random() < 0.25
    question = f"{text}\n\n{rng.choice(QUESTIONS)}"
    if chat:
        body["messages"] = [{"role": "user", "content": question}]
    else:
        body["prompt"] = question
    if mode == "json_schema":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
        }
    elif mode == "regex":
        body["regex"] = rng.choice(REGEXES)
    route = "/v1/chat/completions" if chat else "/v1/completions"
    kind = f"{mode} n{n} {tokens // 500 * 500}-{tokens // 500 * 500 + 499} tokens"
    return kind, route, body


def first_body() -> dict[str, Any]:
    """The first request: a short chat question, free, greedy, one row."""
    return {
        "model": "x",
        "messages": [{"role": "user", "content": QUESTIONS[0]}],
        "max_tokens": 16,
        "temperature": 0,
    }


def run_requests(soak: Soak, args: argparse.Namespace, ratio: float) -> list[dict[str, Any]]:
    """Send the mix through ``args.clients`` threads; RSS after every ``args.every``."""
    rng = random.Random(args.seed)
    jobs = [
        request_body(rng, args.max_prompt_tokens, args.max_tokens, ratio)
        for _ in range(args.requests)
    ]
    samples: list[dict[str, Any]] = []
    lock = threading.Lock()
    queue = list(reversed(jobs))

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                kind, route, body = queue.pop()
            result = generate(soak, kind, route, body)
            with lock:
                soak.results.append(result)
                done = len(soak.results) - 1  # the first request is not of the mix
                if done % args.every == 0 and done < args.requests:
                    rss = vm_status(soak.pid, "VmRSS") or 0
                    samples.append({"requests": done, "at_s": round(soak.now(), 1), "rss": rss})
                    print(
                        f"{done:5d} requests  {soak.now():7.0f} s  RSS {rss / 2**20:.0f} MiB",
                        file=sys.stderr,
                        flush=True,
                    )

    threads = [threading.Thread(target=worker) for _ in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return samples


def summarise(
    soak: Soak, args: argparse.Namespace, first: int, hwm: int, samples: list[dict[str, Any]]
) -> dict[str, Any]:
    end = samples[-1]["rss"] if samples else 0
    peak = max([first, *(s["rss"] for s in samples), *(b for _, b in soak.rss)])
    mix = soak.results[1:]
    bad = [r for r in soak.results if r.outcome != "ok"]
    ratio = end / first if first else float("inf")
    return {
        "requests": len(mix),
        "clients": args.clients,
        "seed": args.seed,
        "server_flags": args.server_flag,
        "max_prompt_tokens": args.max_prompt_tokens,
        "max_tokens": args.max_tokens,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "seconds": round(soak.now(), 1),
        "rss_after_first": first,
        "rss_end": end,
        "rss_peak_sampled": peak,
        "rss_hwm": hwm,
        "end_over_first": round(ratio, 3),
        "bound": args.bound,
        "passed": ratio <= args.bound and not bad,
        "failed_requests": [
            {"kind": r.kind, "status": r.status, "outcome": r.outcome, "detail": r.detail[:300]}
            for r in bad[:20]
        ],
        "failed_count": len(bad),
        "kinds": dict(sorted(Counter(r.kind for r in mix).items())),
        "samples": samples,
        "rss_series": [[t, b] for t, b in soak.rss],
    }


def sample_rss(soak: Soak, every: float) -> None:
    """RSS every ``every`` seconds (the peak between the per-request samples)."""
    while not soak.stop.wait(every):
        rss = vm_status(soak.pid, "VmRSS")
        if rss is None:
            return
        with soak.lock:
            soak.rss.append((round(soak.now(), 2), rss))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests of the mix (1000)")
    parser.add_argument("--clients", type=int, default=4, help="client threads (4)")
    parser.add_argument("--every", type=int, default=50, help="RSS after every N answers (50)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-prompt-tokens", type=int, default=2000, help="longest prompt")
    parser.add_argument("--max-tokens", type=int, default=16, help="most new tokens (16)")
    parser.add_argument("--model", help="model folder for the server (default model)")
    parser.add_argument("--threads", type=int, help="the server's onnxruntime threads")
    parser.add_argument("--max-batch", type=int, default=4, help="the server's --max-batch (4)")
    parser.add_argument(
        "--server-flag",
        action="append",
        default=[],
        help="one more flag for the server (repeat; e.g. --server-flag=--keep-memory)",
    )
    parser.add_argument("--bound", type=float, default=BOUND, help="end / first RSS (1.5)")
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds after the last answer (3)"
    )
    parser.add_argument("--rss-every", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--json", default="benchmarks/results/soak_memory.json")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.every < 1 or not args.max_prompt_tokens >= 16:
        parser.error("--requests and --every must be >= 1, --max-prompt-tokens >= 16")
    if args.max_tokens < 4 or args.clients < 1:
        parser.error("--max-tokens must be >= 4 and --clients >= 1")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the server, send the first request and the mix; the report."""
    key = secrets.token_hex(8)
    flags = ["--max-batch", str(args.max_batch), "--max-queue", str(4 * args.max_batch * 4)]
    if args.model:
        flags += ["--model", args.model]
    if args.threads:
        flags += ["--threads", str(args.threads)]
    flags += args.server_flag
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - read after the server exits
    server, url = launch(flags, env={**os.environ, "ORTGEN_API_KEY": key}, stderr=log)
    try:
        soak = Soak(url, key, server.pid, 1 << 20)
        ratio = words_per_token(soak)
        first_result = generate(soak, "first", "/v1/chat/completions", first_body())
        soak.results.append(first_result)
        first = vm_status(server.pid, "VmRSS") or 0
        parts = {f"{name}_after_first": vm_status(server.pid, name) for name in PARTS}
        sampler = threading.Thread(target=sample_rss, args=(soak, args.rss_every), daemon=True)
        sampler.start()
        samples = run_requests(soak, args, ratio)
        time.sleep(args.settle)  # the last rows leave the batch after their answers
        end = vm_status(server.pid, "VmRSS") or 0
        parts.update({f"{name}_end": vm_status(server.pid, name) for name in PARTS})
        samples.append({"requests": args.requests, "at_s": round(soak.now(), 1), "rss": end})
        hwm = vm_status(server.pid, "VmHWM") or 0
        soak.stop.set()
        sampler.join()
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:  # a server that will not stop is killed
            server.kill()
            server.wait()
    report = summarise(soak, args, first, hwm, samples)
    report["parts"] = parts
    # without the file pages: clean page cache the kernel can drop, counted by VmRSS
    ours = [
        (parts[f"RssAnon_{at}"] or 0) + (parts[f"RssShmem_{at}"] or 0)
        for at in ("after_first", "end")
    ]
    report["file_free_end_over_first"] = round(ours[1] / ours[0], 3) if ours[0] else None
    log.seek(0)
    report["server_log_tail"] = log.read()[-4000:]
    return report


def table(report: dict[str, Any]) -> str:
    """The report as a few lines of Markdown."""
    mib = 2**20
    lines = [
        f"{report['requests']} requests in {report['seconds']:.0f} s, "
        f"{report['clients']} clients, server flags {report['server_flags'] or 'none'}",
        "",
        "| RSS after the first request | at the end | end / first | peak (VmHWM) | bound |",
        "|---|---|---|---|---|",
        f"| {report['rss_after_first'] / mib:.0f} MiB | {report['rss_end'] / mib:.0f} MiB "
        f"| {report['end_over_first']:.2f}x | {report['rss_hwm'] / mib:.0f} MiB "
        f"| {report['bound']}x |",
        "",
        "Of which anonymous / shared (the KV slots) / file pages: after the first "
        + " / ".join(f"{(report['parts'][f'{p}_after_first'] or 0) / mib:.0f}" for p in PARTS)
        + " MiB, at the end "
        + " / ".join(f"{(report['parts'][f'{p}_end'] or 0) / mib:.0f}" for p in PARTS)
        + f" MiB; without the file pages, end / first: {report['file_free_end_over_first']}x",
        "",
        "RSS after every so many requests: "
        + ", ".join(f"{s['requests']}: {s['rss'] / mib:.0f}" for s in report["samples"]),
    ]
    for failure in report["failed_requests"]:
        lines.append(f"failed: {failure}")
    verdict = "PASS" if report["passed"] else "FAIL"
    lines.append(
        f"\n{verdict}: RSS at the end is {report['end_over_first']:.2f}x the RSS after the "
        f"first request (bound {report['bound']}x); {report['failed_count']} failed requests"
    )
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    report = run(args)
    print(table(report))
    write_report(args.json, report)
    if not report["passed"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
