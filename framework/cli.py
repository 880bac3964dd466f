"""The ``ortgen`` command: one small function per subcommand, over the public API."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import OrtgenError

SAMPLING_FLAGS = (
    ("--max-new-tokens", "max_new_tokens", int),
    ("--temperature", "temperature", float),
    ("--top-k", "top_k", int),
    ("--top-p", "top_p", float),
    ("--seed", "seed", int),
)


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--model", help="exported model folder (default: the built-in model)")
    parser.add_argument("--threads", type=int, help="onnxruntime intra-op threads (default: cores)")


def _add_generation_flags(parser: argparse.ArgumentParser) -> None:
    for flag, dest, kind in SAMPLING_FLAGS:
        parser.add_argument(flag, dest=dest, type=kind, default=None)
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
    settings = {dest: getattr(args, dest) for _, dest, _ in SAMPLING_FLAGS}
    settings["do_sample"] = args.do_sample
    settings = {k: v for k, v in settings.items() if v is not None}
    for item in args.settings:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise OrtgenError(f"--set takes KEY=VALUE, got {item!r}")
        try:
            settings[key] = json.loads(raw)
        except json.JSONDecodeError:
            settings[key] = raw
    return settings


def _load(args: argparse.Namespace):
    from .api import load

    return load(args.model, threads=args.threads)


def cmd_generate(args: argparse.Namespace) -> int:
    settings = _settings(args)
    gen = _load(args)
    for piece in gen.stream(args.prompt, **settings):
        print(piece, end="", flush=True)
    print()
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    settings = _settings(args)
    gen = _load(args)
    system = [{"role": "system", "content": args.system}] if args.system else []
    session = gen.chat_session(system, **settings)
    if args.message is not None:
        _answer(session, args.message)
        return 0
    print("ortgen chat: type a message, an empty line or Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if not line.strip():
            return 0
        _answer(session, line)


def _answer(session, message: str) -> None:
    """Stream one answer; Ctrl-C stops it, and the partial answer stays in the history."""
    pieces = session.send(message)
    try:
        for piece in pieces:
            print(piece, end="", flush=True)
    except KeyboardInterrupt:
        pieces.close()
        print("\n[interrupted]", file=sys.stderr)
    print()


def cmd_export(args: argparse.Namespace) -> int:
    from .default_model import build_default_model
    from .export import export_model, print_progress
    from .paths import models_dir

    if args.default:
        build_default_model(
            Path(args.models_dir) if args.models_dir else models_dir(), progress=print_progress
        )
        return 0
    if not args.source or not args.out:
        raise OrtgenError("ortgen export needs SOURCE and OUT (or --default)")
    export_model(args.source, args.out, progress=print_progress, overwrite=args.overwrite)
    return 0


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
    from .paths import default_model_dir

    folder = Path(args.model) if args.model else default_model_dir()
    if not (folder / "config.json").is_file():
        raise OrtgenError(f"{folder} is not a model folder (it has no config.json)")
    layers = [*config_mod.model_layers(folder), ("call", _settings(args))]
    resolved = config_mod.resolve(layers)
    if args.json:
        print(
            json.dumps({n: {"value": v, "set_by": s} for n, v, s in resolved.describe()}, indent=2)
        )
        return 0
    for name, value, source in resolved.describe():
        print(f"{name:<22} {json.dumps(value):<28} {source}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ortgen", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="stream a continuation of a prompt")
    p.add_argument("prompt")
    _add_model_flags(p)
    _add_generation_flags(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="chat with the model (one MESSAGE, or interactive)")
    p.add_argument("message", nargs="?", help="answer this one message and exit")
    p.add_argument("--system", help="system prompt")
    _add_model_flags(p)
    _add_generation_flags(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("export", help="export a HF folder or GGUF file to an ortgen model folder")
    p.add_argument("source", nargs="?", help="Hugging Face model folder or .gguf file")
    p.add_argument("out", nargs="?", help="output model folder")
    p.add_argument("--default", action="store_true", help="build the default model")
    p.add_argument("--models-dir", help="where --default puts it (default: exported_models/)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("plugins", help="list registered components and their plugins")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("config", help="inspect generation configs")
    config_sub = p.add_subparsers(dest="config_command", required=True)
    p = config_sub.add_parser(
        "show", help="print the resolved config and which layer set each value"
    )
    p.add_argument("-m", "--model", help="exported model folder (default: the built-in model)")
    p.add_argument("--json", action="store_true")
    _add_generation_flags(p)
    p.set_defaults(func=cmd_config_show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except OrtgenError as exc:
        print(f"ortgen: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `ortgen ... | head`: the reader left; not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
