"""Build a plugin manager and fill a registry from it.

Built-ins (``ortgen.plugins.BUILTIN_PLUGINS``) and third-party packages (the
``ortgen`` entry-point group) end in the same ``pm.register``; nothing happens
at import time, so every caller gets a fresh, independent manager.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from functools import partial

import pluggy

from . import hookspecs
from .errors import PluginError
from .registry import KINDS, Registry

ENTRY_POINT_GROUP = "ortgen"


def make_plugin_manager(
    *, load_entry_points: bool = True, disable: Iterable[str] = (), extra: Iterable[object] = ()
) -> pluggy.PluginManager:
    """A manager with the built-ins, installed plugins and ``extra`` plugin objects.

    ``disable`` blocks plugins by name (module name for built-ins, entry-point
    name for installed packages) before they are loaded.
    """
    from ortgen.plugins import BUILTIN_PLUGINS

    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for name in disable:
        pm.set_blocked(name)
    for module_name in BUILTIN_PLUGINS:
        if pm.is_blocked(module_name):
            continue
        pm.register(importlib.import_module(module_name), name=module_name)
    if load_entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    for plugin in extra:
        pm.register(plugin)
    return pm


def build_registry(pm: pluggy.PluginManager) -> Registry:
    """Call every registration hook once and collect the factories."""
    registry = Registry()
    for kind, hook_name in KINDS.items():
        hook = getattr(pm.hook, hook_name)
        for impl in hook.get_hookimpls():
            plugin_name = pm.get_name(impl.plugin) or repr(impl.plugin)
            register = partial(_register, registry, kind, plugin_name)
            try:
                impl.function(register)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"plugin {plugin_name!r} failed in {hook_name}: {type(exc).__name__}: {exc}"
                ) from exc
    return registry


def _register(registry: Registry, kind: str, plugin: str, name: str, factory, *, replace=False):
    registry.register(kind, name, factory, plugin=plugin, replace=replace)
