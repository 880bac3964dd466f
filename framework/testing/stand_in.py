"""A generator on a ``FakeModel`` with one component under test registered, as a plugin
package would register it: what ``check_kv_cache`` and ``check_drafter`` drive."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..api import TextGenerator
from ..plugin_host.hookspecs import Register, hookimpl
from .fake_model import FakeModel

if TYPE_CHECKING:
    from ..model.session import ExportedModel


class _OneComponent:
    """A plugin that registers one factory of one kind ("kv_cache" or "drafter")."""

    def __init__(self, kind: str, name: str, factory: Callable[..., Any]) -> None:
        self.kind, self.name, self.factory = kind, name, factory

    @hookimpl
    def register_kv_caches(self, register: Register[Any]) -> None:
        if self.kind == "kv_cache":
            register(self.name, self.factory)

    @hookimpl
    def register_drafters(self, register: Register[Any]) -> None:
        if self.kind == "drafter":
            register(self.name, self.factory)


def generator_with(
    model: FakeModel, kind: str, name: str, factory: Callable[..., Any]
) -> TextGenerator:
    """A ``TextGenerator`` over ``model`` (it has what the loop uses of an
    ``ExportedModel``) with ``factory`` registered as ``name``."""
    stand_in = cast("ExportedModel", model)
    return TextGenerator(model.path, model=stand_in, plugins=[_OneComponent(kind, name, factory)])
