"""The ``ortgen`` argument parser: each command's module adds its own subcommand."""

from __future__ import annotations

import argparse
from typing import Any

from ..plugin_host.registry import did_you_mean
from . import bench, chat, config, export, generate, plugins, run, serve

DESCRIPTION = "The ``ortgen`` command: one small function per subcommand, over the public API."

#: in ``ortgen --help`` order
COMMANDS = (generate, chat, export, bench, run, serve, plugins, config)


class Parser(argparse.ArgumentParser):
    """argparse, with a did-you-mean for a misspelt flag (``--temprature``)."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            flags = flags_of(self, parsed)
            hints = []
            for item in unknown:
                flag = item.split("=", 1)[0]
                hint = did_you_mean(flag, flags) if flag.startswith("-") else ""
                hints.append(f"{item}{hint}")
            self.error(f"unrecognized arguments: {' '.join(hints)}")
        return parsed


def flags_of(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> list[str]:
    """The option strings of the subcommand that was chosen (or of ``parser``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
            if chosen is not None:
                return flags_of(chosen, parsed)
    return [flag for action in parser._actions for flag in action.option_strings]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="ortgen", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_command(sub)
    return parser
