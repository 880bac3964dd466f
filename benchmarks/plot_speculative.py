"""Chart of ``benchmarks/speculative.py``'s results: decode tokens/s per workload without
and with prompt lookup, and the ratio.

    python benchmarks/plot_speculative.py [--results benchmarks/results/speculative.json]
        [--out docs/img/speculative.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(ROOT / "benchmarks/results/speculative.json"))
    parser.add_argument("--out", default=str(ROOT / "docs/img/speculative.png"))
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(args.results).read_text(encoding="utf-8"))
    names = list(data["categories"])
    plain = [
        statistics.median(r["plain_tok_s"] for r in c["requests"])
        for c in data["categories"].values()
    ]
    lookup = [
        statistics.median(r["lookup_tok_s"] for r in c["requests"])
        for c in data["categories"].values()
    ]
    ratios = [c["speedup_geomean"] for c in data["categories"].values()]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], plain, 0.4, label="plain decoding")
    ax.bar(
        [i + 0.2 for i in x],
        lookup,
        0.4,
        label=f"prompt lookup ({data['prompt_lookup_num_tokens']})",
    )
    for i, (value, ratio) in enumerate(zip(lookup, ratios, strict=True)):
        ax.annotate(f"{ratio:.2f}x", (i + 0.2, value), ha="center", va="bottom", fontsize=9)
    ax.set_xticks(list(x), [n.replace(" (control)", "\n(control)") for n in names], fontsize=8)
    ax.set_ylabel("decode tokens/s (median)")
    ax.set_ylim(0, max(plain + lookup) * 1.12)
    ax.set_title(
        f"Speculative decoding by workload, default model, {data['threads']} thread "
        f"(copy-heavy geomean {data['copy_heavy_speedup_geomean']:.2f}x)",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
