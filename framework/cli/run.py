"""``ortgen run PIPELINE --input FILE --output FILE``: a batch job over a file of rows."""

from __future__ import annotations

import argparse
import functools
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.run_options import ENGINES, TASKS
from ..errors import ConfigError, OrtgenError, Problem
from ..loop.embedding import POOLINGS
from .args import add_generation_flags, add_model_flags, plugins_of, settings_of
from .structured import add_structured_flags

if TYPE_CHECKING:
    from ..config.pipeline import Pipeline

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
    p.add_argument(
        "--task", choices=TASKS, help="generate (default: [run] task) or embed each row's text"
    )
    p.add_argument("--pooling", choices=POOLINGS, help="--task embed: last (default) or mean")
    p.add_argument(
        "--dimensions", type=int, metavar="N", help="--task embed: keep the first N components"
    )
    p.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        help="--task embed: L2-normalise each vector (default: yes)",
    )
    p.add_argument("--dry-run", action="store_true", help="check pipeline and rows; no model")
    p.add_argument(
        "--rerun-changed",
        action="store_true",
        help="redo the rows of the output done under other settings (model, pipeline, "
        "flags or the row's own); without it such a rerun stops",
    )
    add_model_flags(p, pipeline=False)
    add_generation_flags(p)
    add_structured_flags(p)
    p.set_defaults(func=cmd_run, one_shot=False)  # worker processes, files being written


def cmd_run(args: argparse.Namespace) -> int:
    """A batch job over an input file; the flags win over the pipeline's [run] options.
    Everything that can be checked without the model is checked before it loads."""
    from ..jobs import run_job

    pipeline, settings, plugins = _checked_job(args)
    batch_size = pipeline.run.batch_size if args.batch_size is None else args.batch_size
    engine = args.engine or pipeline.run.engine
    address = args.address if args.address is not None else pipeline.run.address
    workers = args.workers if args.workers is not None else pipeline.run.workers
    task = args.task or pipeline.run.task
    if args.dry_run:
        from ..jobs.dry_run import dry_run

        lines, good = dry_run(
            pipeline,
            args.input,
            settings,
            model=args.model,
            engine=engine,
            input_format=args.input_format,
            task=task,
        )
        print("\n".join(lines))
        return 0 if good else 2
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
            rerun_changed=args.rerun_changed,
            **(
                {"task": task, "embedding": _embed_options(args, pipeline)}
                if task == "embed"
                else {}
            ),
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


def _checked_job(args: argparse.Namespace) -> tuple[Pipeline, dict[str, Any], list[Any]]:
    """The pipeline, the job's settings and its ``--plugin`` modules, with every problem of
    the file and of the command line found in one pass and raised in one ConfigError
    (``problems``: (field, message), the field a place in the file or a flag). A
    ``--plugin`` that cannot be imported is an error of its own, before the rest."""
    from .. import config as config_mod
    from ..config.pipeline import check_pipeline, pipeline_error
    from ..jobs.runner import ONE_RESULT_PER_ROW
    from ..plugin_host.manager import build_registry, make_plugin_manager

    # first and alone, as every command does: without the plugin the file's components
    # would be checked against a registry that lacks its components
    plugins = plugins_of(args)
    flags: list[Problem] = []

    def registry_for(disable: tuple[str, ...]) -> Any:  # the file may name their components
        return build_registry(make_plugin_manager(disable=disable, extra=plugins))

    pipeline, problems = check_pipeline(args.pipeline, registry=registry_for)
    settings: dict[str, Any] = {}
    try:
        settings = settings_of(args)
    except OrtgenError as exc:
        flags.append((None, str(exc)))
    layers = [] if problems else [("pipeline", pipeline.settings)]
    try:  # the job's settings over the pipeline's, as every row's request resolves them
        config = config_mod.resolve([*layers, ("call", settings)]).config
    except ConfigError as exc:
        flags.extend((field, f"command line: {message}") for field, message in exc.problems)
    else:
        if config.num_return_sequences != 1:
            flags.append(("num_return_sequences", ONE_RESULT_PER_ROW))
    if args.batch_size is not None and args.batch_size < 1:
        flags.append(("--batch-size", f"--batch-size must be at least 1, got {args.batch_size}"))
    engine = args.engine or pipeline.run.engine
    if engine == "ray" and getattr(args, "plugin", None):
        flags.append(("--plugin", PLUGINS_ON_RAY))
    if engine != "ray" and (args.address is not None or args.workers is not None):
        flags.append(("--engine", "--address and --workers are for the ray engine (--engine ray)"))
    if args.workers is not None and args.workers < 1:
        flags.append(("--workers", f"--workers must be at least 1, got {args.workers}"))
    flags.extend(_task_problems(args, pipeline))
    if not args.dry_run and not args.output:
        flags.append(
            ("--output", "ortgen run needs --output FILE (only --dry-run runs without one)")
        )
    if not _is_file(args.input):  # before the model loads, not after
        flags.append(("--input", f"input file {args.input} does not exist"))
    else:
        flags.extend(_format_problems(args, args.task or pipeline.run.task))
    if problems or flags:
        raise pipeline_error(args.pipeline, problems, flags)
    return pipeline, settings, plugins


def _embed_options(args: argparse.Namespace, pipeline: Pipeline) -> Any:
    """An embed job's pooling options: the flags over ``[run]``'s."""
    from ..jobs.embedding import EmbedOptions

    run = pipeline.run
    return EmbedOptions(
        pooling=args.pooling or run.pooling,
        normalize=run.normalize if args.normalize is None else args.normalize,
        dimensions=run.dimensions if args.dimensions is None else args.dimensions,
    )


def _task_problems(args: argparse.Namespace, pipeline: Pipeline) -> list[Problem]:
    """Embedding options (flags, or ``[run]``'s) on a job that generates, or a bad one."""
    from ..config.run_options import EMBED_KEYS, RunOptions

    task = args.task or pipeline.run.task
    given = [(f"--{k}", f"--{k}") for k in EMBED_KEYS if getattr(args, k) is not None]
    given += [
        (f"run.{k}", f"[run] {k}")
        for k in EMBED_KEYS
        if getattr(pipeline.run, k) != getattr(RunOptions(), k)
    ]
    if task != "embed":
        return [(given[0][0], f"{given[0][1]} is for --task embed")] if given else []
    try:
        _embed_options(args, pipeline)
    except OrtgenError as exc:
        return [(given[0][0] if given else "--task", f"command line: {exc}")]
    return []


def _format_problems(args: argparse.Namespace, task: str) -> list[Problem]:
    """The input's format, and an output it cannot write (OpenAI lines as Parquet)."""
    from ..jobs.formats import job_format

    try:
        fmt = job_format(args.input, args.input_format, task=task)
        if not args.dry_run and args.output:
            fmt.results(args.output)
    except ConfigError as exc:
        return [("--input-format", str(exc))]
    return []


def _is_file(path: str) -> bool:
    try:
        return Path(path).is_file()
    except OSError:  # a name the system refuses (too long, say)
        return False


PLUGINS_ON_RAY = (
    "--plugin is for the local engine: Ray workers import plugins through their entry "
    "points, so install the plugin package where the workers run"
)


class _Terminated(BaseException):
    """SIGTERM during a job, raised in the main thread as SIGINT raises KeyboardInterrupt:
    the job unwinds through its ``finally`` blocks (the output closed whole and its lock
    let go, a Ray cluster it started shut down) instead of dying mid-write. A
    BaseException, so the runner's retry of a failed batch (``except Exception``) does
    not take it for a failing row."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated
