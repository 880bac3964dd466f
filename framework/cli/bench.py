"""``ortgen bench``: flags checked, then one report or KV-cache backends side by side."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import OrtgenError
from .args import add_generation_flags, add_model_flags, component_spec, plugins_of, settings_of


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure speed, memory and output quality of a model")
    add_model_flags(p, pipeline=False)
    p.set_defaults(threads=1)
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    p.add_argument("--prompt-tokens", type=int, default=38, help="prompt length (default 38)")
    p.add_argument("--prompt-ids", help="JSON file with the prompt's token ids")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens per row (default 128)")
    p.add_argument("--batch", type=int, default=1, help="rows of mixed lengths (default 1)")
    p.add_argument(
        "--cache",
        action="append",
        help="KV cache NAME[:key=value,...]; repeat to compare backends (each in its own "
        "process; agreement is then with the dynamic cache)",
    )
    p.add_argument("--plot", metavar="FILE.png", help="with --cache: ms/token and KV MiB plot")
    p.add_argument("--eval-tokens", type=int, help="score only this many tokens of the text")
    p.add_argument("--reference", help="fp32 model folder for top-1 agreement")
    p.add_argument("--no-quality", action="store_true", help="skip perplexity and agreement")
    add_generation_flags(p, length=False, cache=False)  # its own --cache; --new-tokens
    p.set_defaults(func=cmd_bench, one_shot=True)


def cmd_bench(args: argparse.Namespace) -> int:
    """One report, or KV-cache backends side by side (``--cache``)."""
    from ..bench import BenchSettings, format_report, run_bench

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
    plugins_of(args)  # a --plugin that cannot be imported fails here, before any run
    settings = BenchSettings(
        model=args.model,
        prompt_tokens=args.prompt_tokens,
        prompt_ids=prompt_ids,
        new_tokens=args.new_tokens,
        threads=args.threads,
        spin_us=args.spin_us,
        batch=args.batch,
        settings=settings_of(args),
        quality=not args.no_quality,
        reference=args.reference,
        eval_tokens=args.eval_tokens,
        plugins=tuple(args.plugin),
    )
    if args.cache:  # backends side by side, each in its own process
        from ..bench.caches import compare_caches, format_table

        reports = compare_caches(settings, [component_spec(c) for c in args.cache], args.plot)
        one = reports[0] if len(reports) == 1 else reports
        print(json.dumps(one) if args.json else format_table(reports))
        return 0
    if args.plot:
        raise OrtgenError("--plot draws KV-cache backends: give at least one --cache")
    report = run_bench(settings)
    print(json.dumps(report) if args.json else format_report(report))
    return 0
