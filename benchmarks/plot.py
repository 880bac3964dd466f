"""Render benchmarks/results/context_sweep.json into docs/img/*.png."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(source: str = "benchmarks/results/context_sweep.json", out_dir: str = "docs/img") -> None:
    report = json.loads(Path(source).read_text())
    points = report["points"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for threads in sorted({p["threads"] for p in points}):
        rows = sorted((p for p in points if p["threads"] == threads), key=lambda p: p["context"])
        ctx = [p["context"] for p in rows]
        label = f"{threads} thread{'s' if threads > 1 else ''}"
        axes[0].plot(ctx, [p["decode_ms_per_token"] for p in rows], marker="o", label=label)
        axes[1].plot(ctx, [p["prefill_tok_s"] for p in rows], marker="o", label=label)
        axes[2].plot(ctx, [100 * p["share_in_session_run"] for p in rows], marker="o", label=label)
    axes[0].set(title="decode", xlabel="context (tokens)", ylabel="ms / token")
    axes[1].set(title="prefill", xlabel="prompt (tokens)", ylabel="tokens / s")
    axes[2].set(title="decode time inside session.run", xlabel="context (tokens)", ylabel="%")
    axes[2].axhline(98, color="grey", linestyle="--", linewidth=1, label="goal 98%")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("SmolLM2-135M-Instruct, optimum fp32 graph, ortgen loop")
    fig.tight_layout()
    fig.savefig(out / "context_sweep.png", dpi=90)
    print(f"written {out / 'context_sweep.png'}")


if __name__ == "__main__":
    main(*sys.argv[1:])
