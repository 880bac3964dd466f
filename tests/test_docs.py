"""The docs cover the code: every hook, setting, CLI flag and built-in component.

In the style of datasette's ``tests/test_docs.py``: the lists come from the code
(hook specs, ``GenerationConfig`` fields, ``build_parser()``, the built-in registry),
one parametrized test per item, so a new hook, setting or flag fails here until
it is documented, and the failure names what is missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import pytest

from ortgen import config as config_mod
from ortgen.cli import build_parser
from ortgen.plugin_host import hookspecs
from ortgen.plugin_host.manager import build_registry, make_plugin_manager
from ortgen.plugin_host.registry import KINDS

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _read(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _headings(text: str) -> list[str]:
    """Markdown headings without the '#'s and backticks."""
    return [
        m.group(1).replace("`", "").strip() for m in re.finditer(r"^#{1,6}\s+(.+)$", text, re.M)
    ]


def _sections(text: str) -> dict[str, str]:
    """Heading -> text up to the next heading of the same or a higher level."""
    matches = list(re.finditer(r"^(#{1,6})\s+(.+)$", text, re.M))
    sections = {}
    for i, m in enumerate(matches):
        level = len(m.group(1))
        end = next((n.start() for n in matches[i + 1 :] if len(n.group(1)) <= level), len(text))
        sections[m.group(2).replace("`", "").strip()] = text[m.end() : end]
    return sections


def _mentions(text: str, word: str) -> bool:
    """``word`` as a whole token (not part of a longer name or flag)."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


# --- hooks -> docs/plugins.md ---------------------------------------------------

HOOKS = sorted(
    name
    for name, value in vars(hookspecs).items()
    if callable(value) and hasattr(value, f"{hookspecs.PROJECT_NAME}_spec")
)


def test_hooks_found() -> None:
    assert set(HOOKS) == set(KINDS.values())


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented(hook: str) -> None:
    assert hook in _headings(_read("plugins.md")), f"docs/plugins.md has no '### {hook}' section"


# --- GenerationConfig fields -> docs/config.md -----------------------------------

FIELDS = [f.name for f in dataclasses.fields(config_mod.GenerationConfig)]
DEFAULTS = config_mod.GenerationConfig().to_dict()


def _setting_rows(text: str) -> dict[str, list[str]]:
    """Table rows whose first cell is a `setting`: name -> the other cells."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\|\s*`(\w+)`\s*\|(.*)\|\s*$", line)
        if m:
            rows.setdefault(m.group(1), [c.strip() for c in m.group(2).split("|")])
    return rows


@pytest.mark.parametrize("field", FIELDS)
def test_setting_is_documented_with_its_default(field: str) -> None:
    rows = _setting_rows(_read("config.md"))
    assert field in rows, f"docs/config.md has no table row for `{field}`"
    default = rows[field][1]  # columns: type | default | meaning | becomes
    assert default == f"`{json.dumps(DEFAULTS[field])}`", (
        f"docs/config.md gives `{field}` the default {default}; the code says "
        f"{json.dumps(DEFAULTS[field])}"
    )


def test_no_documented_setting_is_missing_from_the_code() -> None:
    documented = set(_setting_rows(_read("config.md")))
    stale = documented - set(FIELDS)
    assert not stale, f"docs/config.md documents settings the code does not have: {stale}"


@pytest.mark.parametrize("field", sorted(config_mod.IGNORED_HF_FIELDS))
def test_ignored_hf_field_is_listed(field: str) -> None:
    assert f"`{field}`" in _read("config.md"), f"docs/config.md does not list `{field}`"


def test_layers_are_documented_in_order() -> None:
    text = _read("config.md")
    positions = [text.find(f"| `{layer}` |") for layer in config_mod.LAYERS]
    assert -1 not in positions, f"a layer is missing from docs/config.md: {config_mod.LAYERS}"
    assert positions == sorted(positions)


# --- CLI -> docs/cli.md -------------------------------------------------------------


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append(((*path, name), sub))
                found.extend(_commands(sub, (*path, name)))
    return found


def _is_leaf(parser: argparse.ArgumentParser) -> bool:
    return not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


COMMANDS = _commands(build_parser())
ARGUMENTS = [
    (" ".join(path), option)
    for path, sub in COMMANDS
    for action in sub._actions
    if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
    for option in (action.option_strings or [action.dest.upper()])
]


def test_cli_commands_found() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"generate", "chat", "export", "plugins", "config", "config show"} <= names


@pytest.mark.parametrize("command", [" ".join(p) for p, _ in COMMANDS])
def test_cli_command_has_a_section(command: str) -> None:
    headings = _headings(_read("cli.md"))
    assert any(h == f"ortgen {command}" or h.startswith(f"ortgen {command} ") for h in headings), (
        f"docs/cli.md has no '## `ortgen {command}`' section"
    )


@pytest.mark.parametrize(("command", "argument"), ARGUMENTS)
def test_cli_argument_is_documented_in_its_section(command: str, argument: str) -> None:
    section = _sections(_read("cli.md")).get(f"ortgen {command}", "")
    assert _mentions(section, argument), (
        f"the '## `ortgen {command}`' section of docs/cli.md does not mention {argument}"
    )


@pytest.mark.parametrize("command", ["make run", "make test"])
def test_make_commands_are_documented(command: str) -> None:
    assert command in _read("cli.md")


# --- built-in components -> docs/config.md or docs/plugins.md ------------------------

_REGISTRY = build_registry(make_plugin_manager(load_entry_points=False))
BUILTINS = [(kind, name) for kind in KINDS for name in _REGISTRY.names(kind)]


def test_builtins_found() -> None:
    assert ("sampler", "greedy") in BUILTINS and ("kv_cache", "dynamic") in BUILTINS


@pytest.mark.parametrize(("kind", "name"), BUILTINS)
def test_builtin_component_is_documented(kind: str, name: str) -> None:
    docs = _read("config.md") + _read("plugins.md")
    assert f"`{name}`" in docs, f"built-in {kind} `{name}` is in neither config.md nor plugins.md"
