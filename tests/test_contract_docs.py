"""Every optional capability the loop probes is documented in docs/plugins.md: the typed
protocols of ``ortgen.protocols`` (and their members), and every attribute name the
loop still asks a component for by ``hasattr``/``getattr``."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

import ortgen
from ortgen import protocols
from ortgen.outputs import SEARCH_DEFAULTS

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
#: where the loop and its callers meet components
PROBING = [*sorted((ROOT / "framework" / "loop").glob("*.py")),
           *(ROOT / "framework" / name for name in ("api.py", "outputs.py", "chain_specs.py")),
           ROOT / "framework" / "serve" / "engine.py"]  # fmt: skip
NOT_CAPABILITIES = {"shape"}  # read for error messages only


def _protocols() -> list[type]:
    return [
        value
        for value in vars(protocols).values()
        if inspect.isclass(value)
        and value.__module__ == protocols.__name__
        and getattr(value, "_is_protocol", False)
    ]


def _members(protocol: type) -> list[str]:
    return [n for n in vars(protocol) if not n.startswith("_")]


def _documented(name: str) -> bool:
    return f"`{name}`" in GUIDE or f"`{name}(" in GUIDE or f" {name}(" in GUIDE


def test_there_are_protocols_to_check() -> None:
    assert {"KVCache", "RowSlots", "ForksCache", "LiftsContext"} <= {
        p.__name__ for p in _protocols()
    }


@pytest.mark.parametrize("protocol", _protocols(), ids=lambda p: p.__name__)
def test_each_protocol_is_exported_and_documented_with_its_members(protocol: type) -> None:
    assert getattr(ortgen, protocol.__name__, None) is protocol, "not exported from ortgen"
    assert _documented(protocol.__name__) or (protocol.__name__ in {
        "LogitsProcessor", "Sampler", "StoppingCriterion", "KVCache", "Drafter",
    } and f"ortgen.{protocol.__name__}" in GUIDE)  # fmt: skip
    missing = [m for m in _members(protocol) if not _documented(m)]
    assert not missing, f"{protocol.__name__}: {missing} not in docs/plugins.md"
    assert typing.runtime_checkable(protocol) is protocol  # isinstance works on it


def _probed_names() -> set[str]:
    names = set()
    for path in PROBING:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "self")
            ):
                names.add(node.args[1].value)
    return names - NOT_CAPABILITIES


def test_every_attribute_the_loop_probes_is_documented() -> None:
    probed = _probed_names() | set(SEARCH_DEFAULTS)
    assert {"sparse", "finish_reason", "copy_row"} <= probed  # the scan finds them
    missing = sorted(name for name in probed if not _documented(name))
    assert not missing, f"probed by the loop but not in docs/plugins.md: {missing}"
