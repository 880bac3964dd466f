"""Chart of ``benchmarks/soak.py``'s report: the server's RSS over time (warm-up shaded,
the 5% line over the post-warm-up RSS) and the generations served per second.

    python benchmarks/plot_soak.py [--results benchmarks/results/soak.json]
        [--out docs/img/soak.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(ROOT / "benchmarks/results/soak.json"))
    parser.add_argument("--out", default=str(ROOT / "docs/img/soak.png"))
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(args.results).read_text(encoding="utf-8"))
    rss = data["rss"]
    minutes = [t / 60 for t, _ in data["rss_series"]]
    mib = [b / 2**20 for _, b in data["rss_series"]]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 4.8), sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    warmup = data["warmup_s"] / 60
    top.axvspan(0, warmup, color="0.9", label="warm-up")
    top.plot(minutes, mib, lw=1.2, label="server RSS (VmRSS)")
    if rss.get("growth") is not None:
        base = rss["warmup_end_bytes"] / 2**20
        top.axhline(base, color="0.5", lw=0.8, ls=":", label=f"after warm-up {base:.0f} MiB")
        top.axhline(base * 1.05, color="tab:red", lw=0.8, ls="--", label="+5% (goal)")
    for i, (at, _) in enumerate(data.get("machine_stalls", [])):
        label = "the client stalled > 1 s (machine)" if i == 0 else None
        top.axvline(at / 60, color="tab:orange", lw=0.6, alpha=0.5, label=label)
    top.set_ylabel("MiB")
    top.set_ylim(0, max(mib) * 1.15)
    growth = rss.get("growth")
    shown = "n/a" if growth is None else f"{100 * growth:+.1f}%"
    top.set_title(
        f"ortgen serve soak: {data['minutes']:g} min, {data['clients']} clients + bursts, "
        f"{data['requests']} requests; RSS after warm-up {shown}",
        fontsize=10,
    )
    top.legend(fontsize=8, loc="lower right")
    served = data["served_per_10s"]
    bottom.bar(
        [t / 60 for t, _ in served], [n / 10 for _, n in served], width=10 / 60, align="edge"
    )
    bottom.set_ylabel("served / s")
    bottom.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
