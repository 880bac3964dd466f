"""``ortgen run PIPELINE --input FILE --output FILE``: a batch job over a file of rows."""

from __future__ import annotations

import argparse
import functools
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config.pipeline import ENGINES
from ..errors import OrtgenError
from .args import add_generation_flags, add_model_flags, plugins_of, settings_of
from .structured import add_structured_flags

#: ``--input-format`` (``ortgen.jobs.formats.INPUT_FORMATS``, which the tests compare:
#: the jobs package is imported only when a job runs)
INPUT_FORMATS = ("auto", "ortgen", "openai")


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a pipeline over a file of requests (JSONL or Parquet)")
    p.add_argument("pipeline", metavar="PIPELINE", help="pipeline file (TOML)")
    p.add_argument("--input", required=True, metavar="FILE", help="rows: JSONL or .parquet")
    p.add_argument("--output", metavar="FILE", help="results: JSONL or .parquet (resumed)")
    p.add_argument("--batch-size", type=int, help="rows per generate call (default: [run])")
    p.add_argument("--engine", choices=ENGINES, help="where rows run (default: [run] engine)")
    p.add_argument(
        "--address", metavar="HOST:PORT", help="ray engine: the cluster to join ([run] address)"
    )
    p.add_argument(
        "--workers", type=int, metavar="N", help="ray engine: actors ([run] workers, default 1)"
    )
    p.add_argument(
        "--input-format",
        choices=INPUT_FORMATS,
        default="auto",
        help="ortgen rows or OpenAI batch lines (default auto: by the first line)",
    )
    p.add_argument("--dry-run", action="store_true", help="check pipeline and rows; no model")
    add_model_flags(p, pipeline=False)
    add_generation_flags(p)
    add_structured_flags(p)
    p.set_defaults(func=cmd_run, one_shot=False)  # worker processes, files being written


def cmd_run(args: argparse.Namespace) -> int:
    """A batch job over an input file; the flags win over the pipeline's [run] options.
    Everything that can be checked without the model is checked before it loads."""
    from ..config.pipeline import load_pipeline
    from ..jobs import job_format, run_job
    from ..plugin_host.manager import build_registry, make_plugin_manager

    plugins = plugins_of(args)

    def registry_for(disable: tuple[str, ...]) -> Any:  # the file may name their components
        return build_registry(make_plugin_manager(disable=disable, extra=plugins))

    pipeline = load_pipeline(args.pipeline, registry=registry_for)
    settings = settings_of(args)
    batch_size = pipeline.run.batch_size if args.batch_size is None else args.batch_size
    if batch_size < 1:
        raise OrtgenError(f"--batch-size must be at least 1, got {batch_size}")
    engine = args.engine or pipeline.run.engine
    if engine == "ray" and plugins:
        raise OrtgenError(
            "--plugin is for the local engine: Ray workers import plugins through their "
            "entry points, so install the plugin package where the workers run"
        )
    if engine != "ray" and (args.address is not None or args.workers is not None):
        raise OrtgenError("--address and --workers are for the ray engine (--engine ray)")
    if args.workers is not None and args.workers < 1:
        raise OrtgenError(f"--workers must be at least 1, got {args.workers}")
    address = args.address if args.address is not None else pipeline.run.address
    workers = args.workers if args.workers is not None else pipeline.run.workers
    if args.dry_run:
        from ..jobs.dry_run import dry_run

        lines, good = dry_run(
            pipeline,
            args.input,
            settings,
            model=args.model,
            engine=engine,
            input_format=args.input_format,
        )
        print("\n".join(lines))
        return 0 if good else 2
    if not args.output:
        raise OrtgenError("ortgen run needs --output FILE (only --dry-run runs without one)")
    if not Path(args.input).is_file():  # before the model loads, not after
        raise OrtgenError(f"input file {args.input} does not exist")
    # an output the input's format cannot write (OpenAI lines as Parquet) too
    job_format(args.input, args.input_format).results(args.output)
    job: Callable[..., Any]
    if engine == "ray":  # the model loads on each worker, not here
        from ..jobs.ray_engine import run_ray_job

        job = functools.partial(
            run_ray_job,
            pipeline,
            model=args.model,
            address=address,
            workers=workers,
            threads=args.threads,
            spin_us=args.spin_us,
        )
    else:
        from ..api import load

        gen = load(
            args.model,
            pipeline=pipeline,
            threads=args.threads,
            spin_us=args.spin_us,
            plugins=plugins,
        )
        job = functools.partial(run_job, gen)
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        job(
            args.input,
            args.output,
            batch_size=batch_size,
            window=pipeline.run.window,
            settings=settings,
            progress=sys.stderr,
            input_format=args.input_format,
        )
    except (KeyboardInterrupt, _Terminated) as stop:
        name = "SIGTERM" if isinstance(stop, _Terminated) else "SIGINT"
        print(
            f"\nortgen: stopped by {name}; the rows done are in the output (the batch in "
            "flight was dropped whole): run the same command again to continue",
            file=sys.stderr,
        )
        return 128 + (signal.SIGTERM if isinstance(stop, _Terminated) else signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


class _Terminated(BaseException):
    """SIGTERM during a job, raised in the main thread as SIGINT raises KeyboardInterrupt:
    the job unwinds through its ``finally`` blocks (the output closed whole and its lock
    let go, a Ray cluster it started shut down) instead of dying mid-write. A
    BaseException, so the runner's retry of a failed batch (``except Exception``) does
    not take it for a failing row."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated
