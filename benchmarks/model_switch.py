"""What switching models costs ``ortgen serve`` under ``--max-loaded``: the latency of a
request that must unload one model and load another, and the server's RSS over many
switches (memory must come back: an unloaded model is freed).

    python benchmarks/model_switch.py [--model FOLDER] [--switches 20] [--max-loaded 1]

Serves the same folder under two ids (``a`` and ``b``, so every switch loads the same
bytes) and alternates greedy requests between them; prints one line per request (model,
seconds, RSS MiB, the answer) and a summary, and checks that both ids answer the same.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.server_helpers import ServerProcess, call  # noqa: E402


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+)", status)
    return int(match.group(1)) / 1024 if match else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the default model)")
    parser.add_argument("--switches", type=int, default=20)
    parser.add_argument("--max-loaded", type=int, default=1)
    args = parser.parse_args()
    if args.model:
        folder = Path(args.model).resolve()
    else:
        from ortgen.gguf.default_model import ensure_default_model

        folder = ensure_default_model()
    server = ServerProcess(
        "-m", f"a={folder}", "-m", f"b={folder}", "--max-loaded", str(args.max_loaded),
        "--api-key", "test-key",
    ).ready()  # fmt: skip
    rows = []
    try:
        start_rss = rss_mib(server.proc.pid)
        for i in range(args.switches):
            model = "ab"[i % 2]
            body = {"model": model, "prompt": "The capital of France is", "max_tokens": 8}
            body["temperature"] = 0
            started = time.perf_counter()
            status, answer = call(server, "/v1/completions", body)
            seconds = time.perf_counter() - started
            if status != 200:
                print(f"request {i} to {model}: {status} {answer}", file=sys.stderr)
                return 1
            text = answer["choices"][0]["text"]
            rows.append((model, seconds, rss_mib(server.proc.pid), text))
            print(f"{i:3d} {model} {seconds:6.2f} s  RSS {rows[-1][2]:7.1f} MiB  {text!r}")
    finally:
        server.stop()
    loads = [float(x) for x in re.findall(r"loaded \w+ in ([\d.]+) s", server.log())]
    switched = [seconds for _, seconds, _, _ in rows[1:]]
    print(f"\nmodel: {folder}, --max-loaded {args.max_loaded}, {args.switches} requests")
    print(f"RSS: {start_rss:.0f} MiB at start (one model loaded), "
          f"{max(r[2] for r in rows):.0f} MiB peak, {rows[-1][2]:.0f} MiB at the end")  # fmt: skip
    if loads:
        print(f"load: median {statistics.median(loads):.2f} s over {len(loads)} loads")
    print(f"request after a switch: median {statistics.median(switched):.2f} s")
    same = len({text for *_, text in rows}) == 1
    print(f"both ids answer the same: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
