"""The ``ortgen bench`` command: flags checked, then one report or a cache comparison."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .bench import BenchSettings, format_report, run_bench
from .cli import _cache_spec, _settings
from .errors import OrtgenError


def run_bench_command(args: argparse.Namespace) -> int:
    """``ortgen bench``: one report, or KV-cache backends side by side (``--cache``)."""

    prompt_ids = None
    if args.prompt_ids:
        try:
            prompt_ids = json.loads(Path(args.prompt_ids).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise OrtgenError(f"--prompt-ids {args.prompt_ids}: {exc}") from exc
        if not isinstance(prompt_ids, list) or not all(isinstance(t, int) for t in prompt_ids):
            raise OrtgenError(f"--prompt-ids {args.prompt_ids} must hold a JSON list of ints")
    for flag, value in (("--new-tokens", args.new_tokens), ("--batch", args.batch)):
        if value < 1:
            raise OrtgenError(f"{flag} must be at least 1, got {value}")
    if args.prompt_tokens < 1:
        raise OrtgenError(f"--prompt-tokens must be at least 1, got {args.prompt_tokens}")
    settings = BenchSettings(
        model=args.model,
        prompt_tokens=args.prompt_tokens,
        prompt_ids=prompt_ids,
        new_tokens=args.new_tokens,
        threads=args.threads,
        spin_us=args.spin_us,
        batch=args.batch,
        settings=_settings(args),
        quality=not args.no_quality,
        reference=args.reference,
        eval_tokens=args.eval_tokens,
    )
    if args.cache:  # backends side by side, each in its own process
        from .bench_caches import compare_caches, format_table

        reports = compare_caches(settings, [_cache_spec(c) for c in args.cache], args.plot)
        one = reports[0] if len(reports) == 1 else reports
        print(json.dumps(one) if args.json else format_table(reports))
        return 0
    if args.plot:
        raise OrtgenError("--plot draws KV-cache backends: give at least one --cache")
    report = run_bench(settings)
    print(json.dumps(report) if args.json else format_report(report))
    return 0
