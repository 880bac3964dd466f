"""``ortgen bench --cache A --cache B ...``: KV-cache backends compared on three axes.

Speed, memory and output are measured apart, because a faster or smaller cache that
silently changes output is not an improvement:

- speed and memory: each backend runs the same greedy request in a fresh process
  (``spawn``), so its peak RSS is its own and not the high-water mark of the one before;
- output: the greedy tokens of that run, and, teacher-forced on the evaluation text
  through each backend, perplexity and top-1 agreement with the ``dynamic`` cache (which
  holds every position exactly).

``--plot FILE.png`` draws decode ms/token and KV MiB against context length per backend
from the runs' per-step traces.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import replace
from pathlib import Path
from typing import Any

from .speed import BenchSettings, load_for, run_bench

#: the backend every other one is compared with: it holds every position as computed
BASELINE = "dynamic"


def compare_caches(
    settings: BenchSettings, caches: list[dict[str, Any]], plot: str | None = None
) -> list[dict[str, Any]]:
    """One report per cache spec (``{"name": ..., **params}``), in the given order."""
    context = multiprocessing.get_context("spawn")
    reports = []
    for spec in caches:
        run = replace(settings, cache=spec, quality=False, trace=bool(plot))
        with context.Pool(1) as pool:  # a fresh process: its own peak RSS
            report = pool.apply(run_bench, (run,))
        report["cache"] = cache_label(spec)
        reports.append(report)
    if settings.quality:
        _add_quality(settings, caches, reports)
    if plot:
        plot_traces(reports, plot)
    return reports


def cache_label(spec: dict[str, Any]) -> str:
    """``name:k=v,...`` as given on the command line."""
    params = ",".join(f"{k}={v}" for k, v in spec.items() if k != "name")
    return f"{spec['name']}:{params}" if params else spec["name"]


def _add_quality(
    settings: BenchSettings, caches: list[dict[str, Any]], reports: list[dict[str, Any]]
) -> None:
    """Teacher-forced perplexity per backend and top-1 agreement with ``dynamic``."""
    from .quality import eval_ids, score_tokens

    gen = load_for(settings)
    if gen.tokenizer is None:
        return
    ids = eval_ids(gen)[: settings.eval_tokens]
    baseline = score_tokens(gen, ids, BASELINE)
    for spec, report in zip(caches, reports, strict=True):
        scores = baseline if spec == {"name": BASELINE} else score_tokens(gen, ids, spec)
        report["perplexity"] = round(scores.perplexity, 4)
        report["agreement_top1"] = round(scores.agreement(baseline), 4)
        report["agreement_with"] = f"{BASELINE} cache"
        report["eval_tokens"] = len(ids)


def format_table(reports: list[dict[str, Any]]) -> str:
    """One column per backend."""
    rows = [
        ("cache", lambda r: r["cache"]),
        ("prefill tok/s", lambda r: f"{r['prefill_tokens_per_s']:.0f}"),
        ("decode tok/s", lambda r: f"{r['decode_tokens_per_s']}"),
        ("decode ms/token p50", lambda r: f"{r['decode_ms_per_token_p50']}"),
        ("peak RSS MB", lambda r: f"{r['peak_rss_mb']:.0f}"),
        ("KV cache MiB", lambda r: f"{r['kv_cache_bytes'] / 2**20:.2f}"),
        ("prefill tokens fed", lambda r: f"{r['prefill_tokens']}"),
        ("greedy = first", lambda r: _same_tokens(r, reports[0])),
        ("perplexity", lambda r: f"{r['perplexity']}"),
        ("top-1 agreement", lambda r: f"{r['agreement_top1']}"),
    ]
    table = [[name] + [str(value(r)) for r in reports] for name, value in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in table
    )


def _same_tokens(report: dict[str, Any], first: dict[str, Any]) -> str:
    mine, theirs = report["greedy_tokens"], first["greedy_tokens"]
    same = next(
        (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), len(mine)
    )
    return "yes" if mine == theirs else f"first {same}"


def plot_traces(reports: list[dict[str, Any]], path: str) -> None:
    """Decode ms/token (a 16-step running median) and KV MiB against context length."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib") from exc
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (speed, memory) = plt.subplots(1, 2, figsize=(11, 4))
    for report in reports:
        trace = np.asarray(report["trace"], dtype=np.float64)
        context, ms, kv = trace[:, 0], trace[:, 1], trace[:, 2]
        window = min(16, len(ms))
        smooth = [np.median(ms[max(0, i - window + 1) : i + 1]) for i in range(len(ms))]
        speed.plot(context, smooth, label=report["cache"])
        memory.plot(context, kv / 2**20, label=report["cache"])
    speed.set(xlabel="context length (tokens)", ylabel="decode ms/token", title="Speed")
    memory.set(xlabel="context length (tokens)", ylabel="KV cache MiB", title="Memory")
    for axis in (speed, memory):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
