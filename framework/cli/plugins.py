"""``ortgen plugins``: every registered component, the plugin that registered it and its
parameters."""

from __future__ import annotations

import argparse
import json


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plugins", help="list registered components and their plugins")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plugins, one_shot=True)


def cmd_plugins(args: argparse.Namespace) -> int:
    from ..plugin_manager import build_registry, make_plugin_manager
    from ..registry import KINDS

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
