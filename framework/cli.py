"""The ``ortgen`` command: one small function per subcommand, over the public API."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .cli_structured import add_structured_flags, structured_settings, warn_if_not_json
from .errors import OrtgenError
from .export.variant import GRAPHS, PRECISIONS
from .pipeline import ENGINES
from .registry import did_you_mean

SAMPLING_FLAGS = (
    ("--max-new-tokens", "max_new_tokens", int),
    ("--temperature", "temperature", float),
    ("--top-k", "top_k", int),
    ("--top-p", "top_p", float),
    ("--seed", "seed", int),
)


def _add_model_flags(parser: argparse.ArgumentParser, *, pipeline: bool = True) -> None:
    parser.add_argument("-m", "--model", help="exported model folder (default: the built-in model)")
    parser.add_argument("--threads", type=int, help="onnxruntime intra-op threads (default: cores)")
    parser.add_argument(
        "--spin-us",
        type=int,
        metavar="US",
        help="microseconds an idle onnxruntime thread spins before it sleeps (0: never; "
        "default: a short spin, see docs/cli.md)",
    )
    if pipeline:
        _add_pipeline_flag(parser)


def _add_pipeline_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pipeline",
        metavar="FILE",
        help="pipeline file (TOML): the pipeline layer of the config, its model and plugins",
    )


def _add_generation_flags(
    parser: argparse.ArgumentParser, *, length: bool = True, cache: bool = True
) -> None:
    for flag, dest, kind in SAMPLING_FLAGS:
        if length or dest != "max_new_tokens":
            parser.add_argument(flag, dest=dest, type=kind, default=None)
    if cache:
        parser.add_argument(
            "--cache",
            dest="cache_spec",
            metavar="NAME[:key=value,...]",
            help="KV cache backend, e.g. sliding_window:window=512,sink=4 (docs/caches.md)",
        )
    parser.add_argument(
        "--do-sample",
        dest="do_sample",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="sample instead of greedy decoding (default: the model's generation config)",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any generation setting (JSON value), e.g. --set repetition_penalty=1.1",
    )


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    settings = {dest: getattr(args, dest, None) for _, dest, _ in SAMPLING_FLAGS}
    settings["do_sample"] = args.do_sample
    if getattr(args, "cache_spec", None):
        settings["cache"] = _cache_spec(args.cache_spec)
    settings = {k: v for k, v in settings.items() if v is not None}
    settings.update(structured_settings(args))  # --json-schema, --regex, ... (if any)
    for item in args.settings:
        key, value = _key_value(item, f"--set takes KEY=VALUE, got {item!r}")
        settings[key] = value
    return settings


def _key_value(item: str, error: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE read as JSON when it parses (``0.9``, ``[1, 2]``, ``true``)
    and as a plain string otherwise; ``error`` is raised for anything else."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise OrtgenError(error)
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def _load(args: argparse.Namespace):
    from .api import load

    return load(
        args.model,
        threads=args.threads,
        spin_us=args.spin_us,
        pipeline=getattr(args, "pipeline", None),
    )


def cmd_generate(args: argparse.Namespace) -> int:
    settings = _settings(args)
    gen = _load(args)
    state = gen.start(args.prompt, **settings)
    text = ""
    try:
        for piece in gen.stream_state(state):
            _show(piece)
            text += piece
    except KeyboardInterrupt:
        print("\n[interrupted]", file=sys.stderr)
        return 130
    print()
    warn_if_not_json(gen.resolve_config(settings).config, text, state.finish_reasons[0])
    if not text:
        reason = state.finish_reasons[0]
        print(
            f"ortgen: note: the model ended at once without any text (finish reason: {reason}); "
            'an instruction-tuned model may expect a chat prompt: try `ortgen chat "..."`',
            file=sys.stderr,
        )
    return 0


def _show(piece: str) -> bool:
    """Print a piece of streamed text as it comes; True if there was any."""
    if piece:
        print(piece, end="", flush=True)
    return bool(piece)


def cmd_chat(args: argparse.Namespace) -> int:
    settings = _settings(args)
    gen = _load(args)
    system = [{"role": "system", "content": args.system}] if args.system else []
    session = gen.chat_session(system, **settings)
    if args.message is not None:
        return 130 if _answer(session, args.message) else 0
    print(
        "ortgen chat: type a message, an empty line or Ctrl-D to quit; Ctrl-C stops an answer.",
        file=sys.stderr,
    )
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if not line.strip():
            return 0
        _answer(session, line)


def _answer(session, message: str) -> bool:
    """Stream one answer; Ctrl-C stops it (True), and the partial answer stays in the
    history."""
    pieces = session.send(message)
    try:
        for piece in pieces:
            print(piece, end="", flush=True)
    except KeyboardInterrupt:
        pieces.close()
        print("\n[interrupted]", file=sys.stderr)
        return True
    print()
    config = session.generator.resolve_config(session.settings).config
    warn_if_not_json(config, session.messages[-1]["content"], session.state.finish_reasons[0])
    return False


def cmd_export(args: argparse.Namespace) -> int:
    from .export import DEFAULT_VARIANT, Variant, export_model, print_progress
    from .export.default_model import build_default_model
    from .paths import models_dir

    if args.default:
        chosen = (args.graph, args.precision, args.block_size, args.accuracy_level)
        if any(value is not None for value in chosen):
            raise OrtgenError(
                "--default builds the default variant; --graph/--precision/--block-size/"
                "--accuracy-level apply to `ortgen export SOURCE OUT`"
            )
        where = Path(args.models_dir) if args.models_dir else models_dir()
        build_default_model(where, progress=print_progress, force=args.force)
        return 0
    if not args.source or not args.out:
        raise OrtgenError("ortgen export needs SOURCE and OUT (or --default)")
    variant = Variant(
        graph=args.graph or DEFAULT_VARIANT.graph,
        precision=args.precision or DEFAULT_VARIANT.precision,
        block_size=args.block_size or DEFAULT_VARIANT.block_size,
        accuracy_level=(
            DEFAULT_VARIANT.accuracy_level if args.accuracy_level is None else args.accuracy_level
        ),
    )
    export_model(
        args.source, args.out, variant=variant, progress=print_progress, overwrite=args.overwrite
    )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench_cli import run_bench_command

    return run_bench_command(args)


def _cache_spec(text: str) -> dict[str, Any]:
    """``NAME[:k=v,...]`` -> ``{"name": NAME, k: v, ...}`` (values parsed as JSON)."""
    name, _, params = text.partition(":")
    spec: dict[str, Any] = {"name": name}
    for item in filter(None, params.split(",")):
        key, value = _key_value(item, f"--cache takes NAME[:key=value,...], got {text!r}")
        spec[key] = value
    return spec


def cmd_plugins(args: argparse.Namespace) -> int:
    from .plugin_manager import build_registry, make_plugin_manager
    from .registry import KINDS

    registry = build_registry(make_plugin_manager())
    report = {
        kind: [
            {"name": e.name, "plugin": e.plugin, "parameters": list(e.parameters())}
            for e in registry.entries(kind)
        ]
        for kind in KINDS
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for kind, entries in report.items():
        print(f"{kind}:")
        for e in entries:
            params = ", ".join(e["parameters"])
            print(f"  {e['name']:<22} {e['plugin']:<28} ({params})")
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    from . import config as config_mod
    from .paths import default_model_dir, has_model_config, not_a_model_folder
    from .pipeline import load_pipeline

    pipeline = load_pipeline(args.pipeline) if args.pipeline else None
    model = args.model or (pipeline.model_path() if pipeline else None)
    folder = Path(model) if model else default_model_dir()
    if not has_model_config(folder):
        raise OrtgenError(not_a_model_folder(folder))
    layers = [
        *config_mod.model_layers(folder),
        ("pipeline", pipeline.settings if pipeline else {}),
        ("call", _settings(args)),
    ]
    resolved = config_mod.resolve(layers)
    if args.json:
        print(
            json.dumps({n: {"value": v, "set_by": s} for n, v, s in resolved.describe()}, indent=2)
        )
        return 0
    for name, value, source in resolved.describe():
        print(f"{name:<22} {json.dumps(value):<28} {source}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """A batch job over an input file; the flags win over the pipeline's [run] options.
    Everything that can be checked without the model is checked before it loads."""
    from .jobs import run_job
    from .pipeline import load_pipeline

    pipeline = load_pipeline(args.pipeline)
    settings = _settings(args)
    batch_size = pipeline.run.batch_size if args.batch_size is None else args.batch_size
    if batch_size < 1:
        raise OrtgenError(f"--batch-size must be at least 1, got {batch_size}")
    engine = args.engine or pipeline.run.engine
    if engine != "ray" and (args.address is not None or args.workers is not None):
        raise OrtgenError("--address and --workers are for the ray engine (--engine ray)")
    if args.workers is not None and args.workers < 1:
        raise OrtgenError(f"--workers must be at least 1, got {args.workers}")
    address = args.address if args.address is not None else pipeline.run.address
    workers = args.workers if args.workers is not None else pipeline.run.workers
    if args.dry_run:
        from .jobs.dry_run import dry_run

        lines, good = dry_run(pipeline, args.input, settings, model=args.model, engine=engine)
        print("\n".join(lines))
        return 0 if good else 2
    if not args.output:
        raise OrtgenError("ortgen run needs --output FILE (only --dry-run runs without one)")
    if not Path(args.input).is_file():  # before the model loads, not after
        raise OrtgenError(f"input file {args.input} does not exist")
    job: Callable[..., Any]
    if engine == "ray":  # the model loads on each worker, not here
        from .jobs.ray_engine import run_ray_job

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
        from .api import load

        gen = load(args.model, pipeline=pipeline, threads=args.threads, spin_us=args.spin_us)
        job = functools.partial(run_job, gen)
    try:
        job(
            args.input,
            args.output,
            batch_size=batch_size,
            window=pipeline.run.window,
            settings=settings,
            progress=sys.stderr,
        )
    except KeyboardInterrupt:
        print(
            "\nortgen: interrupted; the rows done are in the output: run the same command "
            "again to continue",
            file=sys.stderr,
        )
        return 130
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from .serve.server import main as serve
    except ImportError as exc:
        raise OrtgenError(f"ortgen serve needs {exc.name}: pip install 'ortgen[serve]'") from exc
    return serve(args)


class _Parser(argparse.ArgumentParser):
    """argparse, with a did-you-mean for a misspelt flag (``--temprature``)."""

    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            flags = _flags_of(self, parsed)
            hints = []
            for item in unknown:
                flag = item.split("=", 1)[0]
                hint = did_you_mean(flag, flags) if flag.startswith("-") else ""
                hints.append(f"{item}{hint}")
            self.error(f"unrecognized arguments: {' '.join(hints)}")
        return parsed


def _flags_of(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> list[str]:
    """The option strings of the subcommand that was chosen (or of ``parser``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
            if chosen is not None:
                return _flags_of(chosen, parsed)
    return [flag for action in parser._actions for flag in action.option_strings]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ortgen", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="stream a continuation of a prompt")
    p.add_argument("prompt")
    _add_model_flags(p)
    _add_generation_flags(p)
    add_structured_flags(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="chat with the model (one MESSAGE, or interactive)")
    p.add_argument("message", nargs="?", help="answer this one message and exit")
    p.add_argument("--system", help="system prompt")
    _add_model_flags(p)
    _add_generation_flags(p)
    add_structured_flags(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("export", help="export a HF folder or GGUF file to an ortgen model folder")
    p.add_argument("source", nargs="?", help="Hugging Face model folder or .gguf file")
    p.add_argument("out", nargs="?", help="output model folder")
    p.add_argument("--default", action="store_true", help="build the default model")
    p.add_argument("--models-dir", help="where --default puts it (default: exported_models/)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    p.add_argument("--force", action="store_true", help="with --default: rebuild even if current")
    p.add_argument("--graph", choices=GRAPHS, help="graph family (default: fused)")
    p.add_argument("--precision", choices=PRECISIONS, help="weights (default: int4)")
    p.add_argument("--block-size", type=int, help="weights per quantisation block (default 32)")
    p.add_argument(
        "--accuracy-level", type=int, help="MatMulNBits activations: 4 = int8 (default), 0 = fp32"
    )
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("bench", help="measure speed, memory and output quality of a model")
    _add_model_flags(p, pipeline=False)
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
    _add_generation_flags(p, length=False, cache=False)  # its own --cache; --new-tokens
    p.set_defaults(func=cmd_bench)

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
    p.add_argument("--dry-run", action="store_true", help="check pipeline and rows; no model")
    _add_model_flags(p, pipeline=False)
    _add_generation_flags(p)
    add_structured_flags(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    _add_model_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free one)")
    p.add_argument("--max-batch", type=int, default=8, help="rows decoded together (default 8)")
    p.add_argument("--max-queue", type=int, default=64, help="rows waiting, then 429 (default 64)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' ($ORTGEN_API_KEY)")
    p.add_argument("--grace", type=float, default=10.0, help="SIGTERM: seconds to finish (10)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest body (1 MiB)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE", help="a plugin")
    p.add_argument(
        "--no-prefix-sharing",
        action="store_true",
        help="prefill every prompt whole, not from a prefix another request left",
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("plugins", help="list registered components and their plugins")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("config", help="inspect generation configs")
    config_sub = p.add_subparsers(dest="config_command", required=True)
    p = config_sub.add_parser(
        "show", help="print the resolved config and which layer set each value"
    )
    p.add_argument("-m", "--model", help="exported model folder (default: the built-in model)")
    _add_pipeline_flag(p)
    p.add_argument("--json", action="store_true")
    _add_generation_flags(p)
    add_structured_flags(p)
    p.set_defaults(func=cmd_config_show)
    return parser


class _CleanWarnings:
    """While a command runs, Python warnings print as ``ortgen: warning: MESSAGE`` on
    stderr: no source path or line, and each distinct message once."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def show(self, message, category, filename, lineno, file=None, line=None) -> None:
        text = " ".join(str(message).split())  # one line, whatever the message holds
        if text in self.seen:
            return
        self.seen.add(text)
        with contextlib.suppress(OSError, ValueError):  # stderr closed: nothing to tell
            print(f"ortgen: warning: {text}", file=file or sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    return _main(build_parser().parse_args(argv))


def entry() -> NoReturn:
    """The ``ortgen`` console script: :func:`main`, then, for a one-shot command, an exit
    without the interpreter's teardown.

    Tearing down numpy, onnxruntime and ~250 modules after ``ortgen generate`` has printed
    its answer took 0.08-0.15 s of a ~1.2 s cold start on a 2-core VM (the process start to
    exit that users wait for). The one-shot commands leave nothing to clean up by then: no
    worker processes (``run``), no server (``serve``), no files being written
    (``export``); ``atexit`` handlers run (logging's shutdown among them), the output is
    flushed, then ``os._exit``.
    ``main()`` itself returns normally, so it can be called in-process.
    """
    args = build_parser().parse_args()
    code = _main(args)
    if args.func in _ONE_SHOT:
        _exit_now(code)
    sys.exit(code)


def _main(args: argparse.Namespace) -> int:
    with warnings.catch_warnings():
        warnings.showwarning = _CleanWarnings().show
        return _run(args)


def _exit_now(code: int) -> NoReturn:
    """End the process at once, after flushing what it wrote (see :func:`entry`).

    ``atexit`` handlers still run (a plugin's, logging's shutdown): what is skipped is the
    interpreter's own teardown, freeing every module and object one by one.
    """
    atexit._run_exitfuncs()  # CPython's, as the interpreter calls it at a normal exit
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone, a stream closed
            stream.flush()
    os._exit(code)


def _run(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except KeyboardInterrupt:  # before any text (loading, prefill): nothing to keep
        print("\nortgen: interrupted", file=sys.stderr)
        return 130
    except OrtgenError as exc:
        print(f"ortgen: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `ortgen ... | head`: the reader left; not an error
        # point stdout at /dev/null so the interpreter's final flush cannot fail again;
        # stderr stays open for anything still worth saying
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


#: commands that own nothing left to clean up once they return (see :func:`entry`)
_ONE_SHOT = frozenset({cmd_generate, cmd_chat, cmd_bench, cmd_plugins, cmd_config_show})

if __name__ == "__main__":
    entry()
