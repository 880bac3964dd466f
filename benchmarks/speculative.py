"""Speculative decoding (prompt lookup) by workload, against the same requests without it.

Every request is a greedy chat on the default model whose text comes from this repository
(nothing downloaded): copy-heavy categories (edit code, extract fields as JSON, answer from
a given passage, rewrite a paragraph with one change) and open-ended writing as the
control. Per request, plain decoding and prompt lookup run alternately in one process
(``--rounds`` each); the report gives, per category, drafted and kept tokens, the
acceptance rate, tokens per decode forward, decode tokens/s of both (medians) and their
ratio, and whether the greedy tokens are identical. Writes JSON to benchmarks/results/.

    python benchmarks/speculative.py [--model DIR] [--threads 1] [--rounds 2] [--tokens 8]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
from pathlib import Path
from typing import Any

import ortgen

ROOT = Path(__file__).resolve().parent.parent


def _excerpt(path: str, start: str, lines: int) -> str:
    text = (ROOT / path).read_text(encoding="utf-8").splitlines()
    first = next(i for i, line in enumerate(text) if start in line)
    return "\n".join(text[first : first + lines])


def _paragraph(path: str, start: str) -> str:
    text = (ROOT / path).read_text(encoding="utf-8")
    at = text.index(start)
    end = text.find("\n\n", at)
    return text[at : end if end > 0 else None].strip()


def workloads() -> dict[str, list[str]]:
    """Category -> user messages, built from files of this repository."""
    rows = _excerpt("framework/loop/rows.py", "def reserve(self, capacity", 10)
    drafters = _excerpt("plugins/drafters.py", "    def draft(self, tokens", 14)
    caches = _excerpt("plugins/caches.py", "    def crop(self, length: int)", 6)
    server = _paragraph("docs/server.md", "A request starts from the longest prompt prefix")
    spec = _paragraph("docs/config.md", "A drafter proposes a row's next tokens")
    bench = _paragraph("docs/cli.md", "Also: `make model`")
    return {
        "edit code": [
            f"Rename the variable `have` to `width` in this Python code. Output the whole "
            f"code.\n\n```python\n{rows}\n```",
            f"Add a comment line at the top of this Python function. Output the whole "
            f"function.\n\n```python\n{drafters}\n```",
            f"Rename the method `crop` to `truncate` in this code and output it all.\n\n"
            f"```python\n{caches}\n```",
        ],
        "extract JSON": [
            f'From this text, output JSON {{"subject": ..., "numbers": [...]}} quoting the '
            f"text's own words.\n\n{server}",
            f'From this text, output JSON with the keys "settings" (a list of the settings '
            f'it names) and "summary" (its first sentence, verbatim).\n\n{spec}',
        ],
        "answer from passage": [
            f"Read the passage and answer by quoting it: what does the prefix cache keep?"
            f"\n\n{server}",
            f"Using the passage, explain what happens to rejected drafts. Quote it.\n\n{spec}",
        ],
        "rewrite": [
            f"Rewrite this paragraph exactly, changing only the word 'request' to 'query'."
            f"\n\n{server}",
            f"Copy this paragraph, replacing 'make' with 'run'.\n\n{bench}",
        ],
        "open-ended writing (control)": [
            "Write a short story about a lighthouse keeper who finds a message in a bottle.",
            "Describe your ideal weekend in a small mountain town.",
            "Write a poem about autumn rain.",
        ],
    }


def _run(gen: Any, prompt: list[int], new: int, settings: dict[str, Any]) -> dict[str, Any]:
    out = gen.generate(prompt, max_new_tokens=new, do_sample=False, **settings)
    stats = out.stats
    tokens = out.tokens[0]
    decode_s = stats["total_s"] - stats.get("prefill_s", 0.0)
    return {
        "tokens": tokens,
        "decode_tok_s": (len(tokens) - 1) / decode_s if decode_s > 0 else 0.0,
        "drafted": int(stats.get("drafted", 0)),
        "accepted": int(stats.get("accepted", 0)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the default model)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each mode per request")
    parser.add_argument("--tokens", type=int, default=8, help="prompt_lookup_num_tokens")
    parser.add_argument("--new", type=int, default=160, help="max new tokens per request")
    parser.add_argument("--out", default="benchmarks/results/speculative.json")
    args = parser.parse_args()
    gen = ortgen.load(args.model, threads=args.threads)
    lookup = {"prompt_lookup_num_tokens": args.tokens}
    report: dict[str, Any] = {
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "prompt_lookup_num_tokens": args.tokens,
        "categories": {},
    }
    gen.generate("Hi", max_new_tokens=4)  # warm-up
    for category, messages in workloads().items():
        rows = []
        for message in messages:
            prompt = gen.chat_prompt([{"role": "user", "content": message}])
            plain, fast = [], []
            for _ in range(args.rounds):  # alternated, so drift hits both alike
                plain.append(_run(gen, prompt, args.new, {}))
                fast.append(_run(gen, prompt, args.new, lookup))
            tokens = plain[0]["tokens"]
            rows.append(
                {
                    "identical": all(r["tokens"] == tokens for r in plain + fast),
                    "new_tokens": len(tokens),
                    "drafted": fast[0]["drafted"],
                    "accepted": fast[0]["accepted"],
                    "plain_tok_s": statistics.median(r["decode_tok_s"] for r in plain),
                    "lookup_tok_s": statistics.median(r["decode_tok_s"] for r in fast),
                }
            )
        drafted = sum(r["drafted"] for r in rows)
        accepted = sum(r["accepted"] for r in rows)
        decoded = sum(r["new_tokens"] - 1 for r in rows)
        ratios = [r["lookup_tok_s"] / r["plain_tok_s"] for r in rows]
        report["categories"][category] = {
            "requests": rows,
            "acceptance": accepted / drafted if drafted else 0.0,
            "tokens_per_forward": decoded / max(1, decoded - accepted),
            "speedup_geomean": math.exp(statistics.fmean(math.log(r) for r in ratios)),
            "identical": all(r["identical"] for r in rows),
        }
    copy = [c for c in report["categories"] if "control" not in c]
    report["copy_heavy_speedup_geomean"] = math.exp(
        statistics.fmean(math.log(report["categories"][c]["speedup_geomean"]) for c in copy)
    )
    print(f"{'category':<30} {'accept':>7} {'tok/fwd':>8} {'plain':>8} {'lookup':>8} "
          f"{'ratio':>6}  identical")  # fmt: skip
    for category, row in report["categories"].items():
        plain = statistics.median(r["plain_tok_s"] for r in row["requests"])
        fast = statistics.median(r["lookup_tok_s"] for r in row["requests"])
        print(
            f"{category:<30} {row['acceptance']:>7.2f} {row['tokens_per_forward']:>8.2f} "
            f"{plain:>8.1f} {fast:>8.1f} {row['speedup_geomean']:>5.2f}x  {row['identical']}"
        )
    print(f"copy-heavy categories together (geometric mean): "
          f"{report['copy_heavy_speedup_geomean']:.2f}x")  # fmt: skip
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"written {out}")


if __name__ == "__main__":
    main()
