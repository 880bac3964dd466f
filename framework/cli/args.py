"""Flags several ``ortgen`` commands share, and how they become generation settings."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from ..errors import OrtgenError
from .structured import structured_settings

if TYPE_CHECKING:
    from types import ModuleType

    from ..api import TextGenerator

SAMPLING_FLAGS = (
    ("--max-new-tokens", "max_new_tokens", int),
    ("--temperature", "temperature", float),
    ("--top-k", "top_k", int),
    ("--top-p", "top_p", float),
    ("--seed", "seed", int),
)


def add_model_flags(
    parser: argparse.ArgumentParser, *, pipeline: bool = True, several: bool = False
) -> None:
    """``-m/--model`` (repeatable with ``several``), ``--threads``, ``--spin-us``,
    ``--plugin`` and (unless told not to) ``--pipeline``."""
    if several:
        parser.add_argument(
            "-m",
            "--model",
            action="append",
            metavar="[NAME=]FOLDER",
            help="an exported model folder, served as NAME (default: the folder's name); "
            "repeat for several models, the first is the default (default: the built-in model)",
        )
    else:
        parser.add_argument(
            "-m", "--model", help="exported model folder (default: the built-in model)"
        )
    parser.add_argument("--threads", type=int, help="onnxruntime intra-op threads (default: cores)")
    parser.add_argument(
        "--spin-us",
        type=int,
        metavar="US",
        help="microseconds an idle onnxruntime thread spins before it sleeps (0: never; "
        "default: a short spin, see docs/cli.md)",
    )
    add_plugin_flag(parser)
    if pipeline:
        add_pipeline_flag(parser)


def add_pipeline_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pipeline",
        metavar="FILE",
        help="pipeline file (TOML): the pipeline layer of the config, its model and plugins",
    )


def add_plugin_flag(parser: argparse.ArgumentParser) -> None:
    """``--plugin SPEC``, repeatable: the same flag, read the same way
    (``ortgen.plugin_host.manager.import_plugin``), on every command that loads plugins."""
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE|FILE.py",
        help="register a plugin that is not installed: an importable module (my_pkg.plugin) "
        "or a Python file (./my_plugin.py), as load(plugins=[...]); repeatable",
    )


def plugins_of(args: argparse.Namespace) -> list[ModuleType]:
    """The ``--plugin`` modules, imported in the order given (an error names the flag)."""
    from ..plugin_host.manager import import_plugin

    return [import_plugin(spec) for spec in getattr(args, "plugin", [])]


def add_generation_flags(
    parser: argparse.ArgumentParser, *, length: bool = True, cache: bool = True
) -> None:
    """The sampling flags, ``--cache``, the speculative ones, ``--chat-format``,
    ``--thinking-budget``, ``--do-sample`` and ``--set KEY=VALUE``."""
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
        "--prompt-lookup",
        dest="prompt_lookup_num_tokens",
        type=int,
        metavar="N",
        help="speculative decoding: draft up to N tokens from the prompt and the text so "
        "far (Hugging Face's prompt_lookup_num_tokens); same output, fewer forwards",
    )
    parser.add_argument(
        "--drafter",
        dest="drafter_spec",
        metavar="NAME[:key=value,...]",
        help="speculative decoding with any registered drafter, e.g. "
        "draft_model:model=FOLDER,num_tokens=4 (docs/plugins.md#drafters)",
    )
    parser.add_argument(
        "--chat-format",
        dest="chat_format",
        metavar="NAME",
        help="the chat format that writes and reads tool calls and thoughts (e.g. hermes, "
        "generic; default: the one the chat template speaks; docs/chat-formats.md)",
    )
    parser.add_argument(
        "--thinking-budget",
        dest="thinking_budget",
        type=int,
        metavar="N",
        help="a thinking model closes its thought after N tokens",
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


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """The call layer of the config: the flags that were given, ``--set`` last."""
    settings = {dest: getattr(args, dest, None) for _, dest, _ in SAMPLING_FLAGS}
    settings["do_sample"] = args.do_sample
    settings["prompt_lookup_num_tokens"] = getattr(args, "prompt_lookup_num_tokens", None)
    settings["chat_format"] = getattr(args, "chat_format", None)
    settings["thinking_budget"] = getattr(args, "thinking_budget", None)
    if getattr(args, "cache_spec", None):
        settings["cache"] = component_spec(args.cache_spec)
    if getattr(args, "drafter_spec", None):
        settings["drafter"] = component_spec(args.drafter_spec, "--drafter")
    settings = {k: v for k, v in settings.items() if v is not None}
    settings.update(structured_settings(args))  # --json-schema, --regex, ... (if any)
    for item in args.settings:
        key, value = key_value(item, f"--set takes KEY=VALUE, got {item!r}")
        settings[key] = value
    return settings


def key_value(item: str, error: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE read as JSON when it parses (``0.9``, ``[1, 2]``, ``true``)
    and as a plain string otherwise; ``error`` is raised for anything else."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise OrtgenError(error)
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw
    except RecursionError:
        raise OrtgenError(f"{error}: the JSON value of {key} is nested too deep") from None


def component_spec(text: str, flag: str = "--cache") -> dict[str, Any]:
    """``NAME[:k=v,...]`` -> ``{"name": NAME, k: v, ...}`` (values parsed as JSON): a
    component named on the command line (``--cache``, ``--drafter``)."""
    name, _, params = text.partition(":")
    spec: dict[str, Any] = {"name": name}
    for item in filter(None, params.split(",")):
        key, value = key_value(item, f"{flag} takes NAME[:key=value,...], got {text!r}")
        spec[key] = value
    return spec


def load_generator(args: argparse.Namespace) -> TextGenerator:
    """The model the flags name (``-m``, ``--pipeline``, threads, ``--plugin``)."""
    from ..api import load

    return load(
        args.model,
        threads=args.threads,
        spin_us=args.spin_us,
        pipeline=getattr(args, "pipeline", None),
        plugins=plugins_of(args),
    )
