"""Render benchmarks/results/sweep.json into docs/img/sweep.png."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(source: str = "benchmarks/results/sweep.json", out_dir: str = "docs/img") -> None:
    points = json.loads(Path(source).read_text())["points"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for threads, batch in sorted({(p["threads"], p["batch"]) for p in points}):
        rows = sorted(
            (p for p in points if p["threads"] == threads and p["batch"] == batch),
            key=lambda p: p["prompt_tokens"][0],
        )
        ctx = [p["prompt_tokens"][0] for p in rows]
        label = f"{threads} thread{'s' if threads > 1 else ''}, batch {batch}"
        axes[0].plot(ctx, [p["decode_tokens_per_s"] for p in rows], marker="o", label=label)
        axes[1].plot(ctx, [p["prefill_tokens_per_s"] for p in rows], marker="o", label=label)
        axes[2].plot(ctx, [100 * p["session_run_share"] for p in rows], marker="o", label=label)
    axes[0].set(title="decode (all rows)", xlabel="context (tokens)", ylabel="tokens / s")
    axes[1].set(title="prefill", xlabel="prompt (tokens, longest row)", ylabel="tokens / s")
    axes[2].set(title="decode time inside session.run", xlabel="context (tokens)", ylabel="%")
    axes[2].axhline(98, color="grey", linestyle="--", linewidth=1, label="goal 98%")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("SmolLM2-135M-Instruct, default model (fused graph, GGUF weights), ortgen loop")
    fig.tight_layout()
    fig.savefig(out / "sweep.png", dpi=90)
    print(f"written {out / 'sweep.png'}")


if __name__ == "__main__":
    main(*sys.argv[1:])
