"""The plugin contract is typed and documented: every protocol of ``ortgen.protocols`` (the
five call contracts and each optional capability) is exported, runtime-checkable and in
docs/plugins.md with its members, and the loop asks no component for a member by name
(``hasattr``/``getattr``): what it uses is declared by a protocol."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

import ortgen
from ortgen import protocols

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
#: where the loop and its callers meet components
PROBING = [*sorted((ROOT / "framework" / "loop").glob("*.py")),
           *(ROOT / "framework" / name for name in ("api.py", "request/outputs.py",
                                                     "plugin_host/chains.py")),
           ROOT / "framework" / "serve" / "engine.py"]  # fmt: skip
NOT_CAPABILITIES = {"shape"}  # read for error messages only


def _protocols() -> list[type]:
    """Every protocol ``ortgen.protocols`` offers (the KV cache's come from
    ``protocols/caches.py`` and are re-exported there)."""
    found = [getattr(protocols, name) for name in protocols.__all__]
    return [p for p in found if inspect.isclass(p) and getattr(p, "_is_protocol", False)]


def _members(protocol: type) -> list[str]:
    names = [*vars(protocol), *vars(protocol).get("__annotations__", {})]
    return [n for n in dict.fromkeys(names) if not n.startswith("_")]


def _documented(name: str) -> bool:
    return f"`{name}`" in GUIDE or f"`{name}(" in GUIDE or f" {name}(" in GUIDE


def test_there_are_protocols_to_check() -> None:
    names = {p.__name__ for p in _protocols()}
    assert {"KVCache", "RowSlots", "ForksCache", "LiftsContext", "NamesFinishReason"} <= names
    assert {"parents", "done", "finalize"} <= set(_members(protocols.SearchStrategy))


def test_every_public_protocol_is_in_protocols_all() -> None:
    """``ortgen`` exports no protocol that ``ortgen.protocols`` does not list."""
    exported = {
        name
        for name in ortgen.__all__
        if inspect.isclass(value := getattr(ortgen, name)) and getattr(value, "_is_protocol", False)
    }
    exported -= {"Register"}  # the registration callback's type, in ortgen.plugin_host.hookspecs
    assert exported == {p.__name__ for p in _protocols()}


@pytest.mark.parametrize("protocol", _protocols(), ids=lambda p: p.__name__)
def test_each_protocol_is_exported_and_documented_with_its_members(protocol: type) -> None:
    assert getattr(ortgen, protocol.__name__, None) is protocol, "not exported from ortgen"
    assert _documented(protocol.__name__) or (protocol.__name__ in {
        "LogitsProcessor", "Sampler", "StoppingCriterion", "KVCache", "Drafter",
    } and f"ortgen.{protocol.__name__}" in GUIDE)  # fmt: skip
    missing = [m for m in _members(protocol) if not _documented(m)]
    assert not missing, f"{protocol.__name__}: {missing} not in docs/plugins.md"
    assert typing.runtime_checkable(protocol) is protocol  # isinstance works on it


def _probed_names(paths: list[Path] = PROBING) -> set[str]:
    names = set()
    for path in paths:
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


def test_the_loop_asks_no_component_for_a_member_by_name() -> None:
    """What the loop uses of a component is declared by a protocol and found with
    ``isinstance`` once per request, never by ``hasattr``/``getattr`` with a name."""
    assert _probed_names() == set()


def test_a_probe_by_name_would_be_found(tmp_path: Path) -> None:
    """The scan above can fail."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f(c):\n    return getattr(c, 'finish_reason', None), hasattr(c, 'x')\n")
    assert _probed_names([probe]) == {"finish_reason", "x"}
