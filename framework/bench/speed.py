"""``ortgen bench``: speed, memory and output quality of one model folder, measured apart.

Speed: load time, time to first token, prefill and decode tokens/s, per-token decode
latency (p50/p95), the share of decode time inside onnxruntime and the Python time per
token around it. Memory: peak RSS and the KV cache's bytes. Output: the greedy tokens,
and teacher-forced perplexity and top-1 agreement with a reference (fp32) model on a
fixed text (``ortgen.bench.quality``). Timings vary between machines and runs: compare ratios
measured in one run, never absolute figures from different days.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class BenchSettings:
    model: str | None = None
    prompt_tokens: int = 38
    prompt_ids: list[int] | None = None
    new_tokens: int = 128
    threads: int | None = 1
    spin_us: int | None = None  # None: ortgen.model.session.DEFAULT_SPIN_US
    batch: int = 1
    cache: str | dict[str, Any] | None = None
    settings: dict[str, Any] | None = None
    quality: bool = True
    reference: str | None = None
    trace: bool = False  # add "trace": [context length, step ms, KV bytes] per decode step
    eval_tokens: int | None = None  # score only the first N tokens of the evaluation text
    #: ``--plugin`` values (module names or .py files), imported where the model loads:
    #: strings, so a backend's own process (``--cache``, spawned) can import them too
    plugins: tuple[str, ...] = ()


class _TimedSession:
    """Wraps an onnxruntime session and records how long each run takes."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.seconds: list[float] = []

    def run_with_iobinding(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self._session.run_with_iobinding(*args, **kwargs)
        finally:
            self.seconds.append(time.perf_counter() - start)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def prompts_for(gen: Any, settings: BenchSettings) -> list[list[int]]:
    """``batch`` prompts: the given ids, or slices of the evaluation text; in a batch the
    rows have different lengths (from ``prompt_tokens`` down to about half of it)."""
    from .quality import eval_ids

    if settings.prompt_ids is not None:
        base = list(settings.prompt_ids)
    else:
        base = eval_ids(gen)[: settings.prompt_tokens]
    rows = []
    for row in range(settings.batch):
        length = max(1, len(base) - row * len(base) // (2 * max(settings.batch, 1)))
        rows.append(base[row : row + length] if row + length <= len(base) else base[:length])
    return rows


def load_for(settings: BenchSettings) -> Any:
    """The generator the settings name, with their ``--plugin`` modules."""
    from ..api import load
    from ..plugin_host.manager import import_plugin

    plugins = [import_plugin(spec) for spec in settings.plugins]
    return load(settings.model, threads=settings.threads, spin_us=settings.spin_us, plugins=plugins)


def run_bench(settings: BenchSettings) -> dict[str, Any]:
    """Measure one model folder; returns the report (the ``--json`` keys)."""
    started = time.perf_counter()
    gen = load_for(settings)
    load_s = time.perf_counter() - started
    prompts = prompts_for(gen, settings)
    call = dict(settings.settings or {})
    call.setdefault("eos_token_id", None)  # fixed work: every row runs all new tokens
    call["max_new_tokens"] = settings.new_tokens
    if settings.cache is not None:
        call["cache"] = settings.cache

    timed = _TimedSession(gen.model.session)
    gen.model.session = timed
    try:
        started = time.perf_counter()
        state = gen.start(prompts, **call)
        state.step()
        first_token_s = time.perf_counter() - started
        prefill_runs = len(timed.seconds)
        step_s: list[float] = []
        kv_bytes: list[int] = []
        while not state.is_done:
            step_started = time.perf_counter()
            state.step()
            step_s.append(time.perf_counter() - step_started)
            kv_bytes.append(_cache_bytes(state))
    finally:
        gen.model.session = timed._session
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    decode_s = float(sum(step_s))
    session_s = float(sum(timed.seconds[prefill_runs:]))
    steps = len(step_s)
    # tokens after each row's first: one per row per step, more when a drafter's are kept
    decoded = sum(len(state.generated(row)) for row in range(len(prompts))) - len(prompts)
    report: dict[str, Any] = {
        "model": str(gen.path),
        "variant": _variant(gen.path),
        "threads": gen.model.threads,
        "batch": len(prompts),
        "prompt_tokens": [len(p) for p in prompts],
        "new_tokens": settings.new_tokens,
        "cache": state.chain.cache_name,
        "load_s": round(load_s, 3),
        "first_token_s": round(first_token_s, 4),
        "prefill_tokens_per_s": round(sum(map(len, prompts)) / first_token_s, 1),
        "decode_tokens_per_s": round(decoded / decode_s, 2) if steps else None,
        "tokens_per_step": round(decoded / steps, 3) if steps else None,
        "decode_ms_per_token_p50": _ms(np.percentile(step_s, 50)) if steps else None,
        "decode_ms_per_token_p95": _ms(np.percentile(step_s, 95)) if steps else None,
        "session_run_share": round(session_s / decode_s, 4) if steps else None,
        "python_ms_per_token": _ms((decode_s - session_s) / steps) if steps else None,
        "peak_rss_mb": round(peak_rss_mb, 1),
        "kv_cache_bytes": _cache_bytes(state),
        "prefill_tokens": int(state.prefill_tokens),
        "greedy_tokens": state.generated(0),
        "agreement_top1": None,
        "perplexity": None,
    }
    if settings.trace:
        first = state.prompt_length + 1  # context length after the first decode step
        report["trace"] = [
            [first + i, _ms(s), b] for i, (s, b) in enumerate(zip(step_s, kv_bytes, strict=True))
        ]
    if settings.quality and gen.tokenizer is not None:
        report.update(quality_report(gen, settings.reference, settings.eval_tokens))
    return report


def quality_report(
    gen: Any, reference: str | None, eval_tokens: int | None = None
) -> dict[str, Any]:
    """Perplexity on the evaluation text, and top-1 agreement with ``reference``'s."""
    from ..api import load
    from .quality import eval_ids, score_tokens

    ids = eval_ids(gen)[:eval_tokens]
    scores = score_tokens(gen, ids)
    result: dict[str, Any] = {"perplexity": round(scores.perplexity, 4), "eval_tokens": len(ids)}
    if reference is not None:
        reference_scores = score_tokens(load(reference, threads=gen.model.threads), ids)
        result["agreement_top1"] = round(scores.agreement(reference_scores), 4)
        result["agreement_with"] = str(reference)
        result["reference_perplexity"] = round(reference_scores.perplexity, 4)
    return result


def format_report(report: dict[str, Any]) -> str:
    """A readable table of the report."""
    rows = [
        ("model", report["model"]),
        ("variant", report["variant"]),
        ("threads / batch / cache", f"{report['threads']} / {report['batch']} / {report['cache']}"),
        ("prompt tokens", ", ".join(map(str, report["prompt_tokens"]))),
        ("load", f"{report['load_s']:.2f} s"),
        ("first token", f"{report['first_token_s']:.3f} s"),
        ("prefill", f"{report['prefill_tokens_per_s']:.0f} tok/s"),
        ("decode", f"{report['decode_tokens_per_s']} tok/s"),
        (
            "decode ms/token p50 / p95",
            f"{report['decode_ms_per_token_p50']} / {report['decode_ms_per_token_p95']}",
        ),
        ("inside session.run", f"{100 * (report['session_run_share'] or 0):.1f}%"),
        ("python ms/token", f"{report['python_ms_per_token']}"),
        ("peak RSS", f"{report['peak_rss_mb']:.0f} MB"),
        ("KV cache", f"{report['kv_cache_bytes'] / 1e6:.1f} MB"),
        ("prefill tokens fed", f"{report['prefill_tokens']}"),
        ("perplexity", f"{report['perplexity']}"),
        ("top-1 agreement", f"{report['agreement_top1']}"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _cache_bytes(state: Any) -> int:
    """Bytes the request's KV cache holds (0 for a chain without one)."""
    cache = state.chain.cache
    return int(cache.nbytes) if cache is not None else 0


def _ms(seconds: float) -> float:
    return round(1e3 * float(seconds), 3)


def _variant(folder: Path) -> str | None:
    from ..export.variant import variant_name
    from ..model.manifest import read_manifest

    return variant_name((read_manifest(folder) or {}).get("variant"))
