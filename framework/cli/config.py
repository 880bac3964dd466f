"""``ortgen config show``: the resolved generation config and the layer that set each value."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import OrtgenError
from .args import add_generation_flags, add_pipeline_flag, settings_of
from .structured import add_structured_flags


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="inspect generation configs")
    config_sub = p.add_subparsers(dest="config_command", required=True)
    p = config_sub.add_parser(
        "show", help="print the resolved config and which layer set each value"
    )
    p.add_argument("-m", "--model", help="exported model folder (default: the built-in model)")
    add_pipeline_flag(p)
    p.add_argument("--json", action="store_true")
    add_generation_flags(p)
    add_structured_flags(p)
    p.set_defaults(func=cmd_config_show, one_shot=True)


def cmd_config_show(args: argparse.Namespace) -> int:
    from .. import config as config_mod
    from ..config.pipeline import load_pipeline
    from ..model.paths import default_model_dir, has_model_config, not_a_model_folder

    pipeline = load_pipeline(args.pipeline) if args.pipeline else None
    model = args.model or (pipeline.model_path() if pipeline else None)
    folder = Path(model) if model else default_model_dir()
    if not has_model_config(folder):
        raise OrtgenError(not_a_model_folder(folder))
    layers = [
        *config_mod.model_layers(folder),
        ("pipeline", pipeline.settings if pipeline else {}),
        ("call", settings_of(args)),
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
