"""``ortgen plugins``: every registered component, the plugin that registered it and its
parameters; then every plugin, loaded, disabled or broken (with the cause)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import warnings
from typing import Any

from .args import add_plugin_flag, plugins_of


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plugins", help="list registered components and their plugins")
    p.add_argument("--json", action="store_true")
    add_plugin_flag(p)
    p.set_defaults(func=cmd_plugins, one_shot=True)


def cmd_plugins(args: argparse.Namespace) -> int:
    from ..plugin_host.manager import BrokenPluginWarning, build_registry, make_plugin_manager
    from ..plugin_host.registry import KINDS

    with warnings.catch_warnings():
        # the listing says what is broken and why: the warnings would say it twice
        warnings.simplefilter("ignore", BrokenPluginWarning)
        manager = make_plugin_manager(extra=plugins_of(args))
        registry = build_registry(manager)
    report: dict[str, list[dict[str, Any]]] = {
        kind: [
            {"name": e.name, "plugin": e.plugin, "parameters": list(e.parameters())}
            for e in registry.entries(kind)
        ]
        for kind in KINDS
    }
    plugins = [dataclasses.asdict(info) for info in manager.plugin_infos()]
    if args.json:
        print(json.dumps({**report, "plugins": plugins}, indent=2))
        return 0
    for kind, entries in report.items():
        print(f"{kind}:")
        for e in entries:
            params = ", ".join(e["parameters"])
            print(f"  {e['name']:<22} {e['plugin']:<28} ({params})")
    lines = _plugin_lines(plugins)
    width = max(len(line[0]) for line in lines)
    print("plugins:")
    for name, status, where, cause in lines:
        print(f"  {name:<{width}} {status:<8} {where}")
        if cause:
            print(f"  {'':<{width}} {'':<8} {cause}")
    return 0


#: what the text shows in place of a distribution for a plugin that is not installed
_NO_SOURCE = {"unknown": "no plugin has this name"}


def _plugin_lines(plugins: list[dict[str, Any]]) -> list[tuple[str, str, str, str | None]]:
    """(name, status, where from, cause) per plugin; the built-ins that loaded, which
    say nothing a reader needs one by one, as one line."""
    builtin = [p for p in plugins if p["origin"] == "built-in" and p["status"] == "loaded"]
    lines: list[tuple[str, str, str, str | None]] = []
    if builtin:
        lines.append(("ortgen.plugins.*", "loaded", f"built-in ({len(builtin)} modules)", None))
    lines += [
        (
            p["name"],
            p["status"],
            p["source"] or _NO_SOURCE.get(p["origin"], p["origin"]),
            p["cause"],
        )
        for p in plugins
        if p not in builtin
    ]
    return lines
