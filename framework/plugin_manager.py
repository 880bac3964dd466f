"""Build a plugin manager and fill a registry from it.

Built-ins (``ortgen.plugins.BUILTIN_PLUGINS``) and third-party packages (the
``ortgen`` entry-point group) end in the same ``pm.register``; nothing happens
at import time, so every caller gets a fresh, independent manager.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from functools import partial
from types import ModuleType

import pluggy

from . import hookspecs
from .errors import PluginError
from .installed import metadata_folders
from .registry import KINDS, Registry

ENTRY_POINT_GROUP = "ortgen"
#: the package whose ``BUILTIN_PLUGINS`` lists the built-in plugin modules
BUILTIN_PACKAGE = "ortgen.plugins"


def make_plugin_manager(
    *, load_entry_points: bool = True, disable: Iterable[str] = (), extra: Iterable[object] = ()
) -> pluggy.PluginManager:
    """A manager with the built-ins, installed plugins and ``extra`` plugin objects.

    ``disable`` blocks plugins by name (module name for built-ins, entry-point
    name for installed packages) before they are loaded.
    """
    # imported by name, as an entry point is: the host does not depend on its plugins
    builtins = importlib.import_module(BUILTIN_PACKAGE).BUILTIN_PLUGINS
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for name in disable:
        pm.set_blocked(name)
    for module_name in builtins:
        if not pm.is_blocked(module_name):
            _register(pm, importlib.import_module(module_name), module_name)
    if load_entry_points and _entry_points_may_exist(ENTRY_POINT_GROUP):
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"installed plugin {exc.plugin!r} is invalid: {exc}") from exc
        except Exception as exc:  # an installed package that fails to import
            raise PluginError(
                f"loading plugins from the {ENTRY_POINT_GROUP!r} entry-point group failed: "
                f"{type(exc).__name__}: {exc}; uninstall or disable the broken plugin"
            ) from exc
    for plugin in extra:
        _register(pm, plugin, plugin_name(plugin))
    try:
        pm.check_pending()  # an @hookimpl whose name is not one of ortgen's hooks
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {pm.get_name(exc.plugin)!r}: {exc}") from exc
    return pm


def _entry_points_may_exist(group: str) -> bool:
    """False only when no distribution on ``sys.path`` declares an entry point in ``group``.

    pluggy's loader imports ``importlib.metadata`` and parses every distribution's entry
    points: ~0.09 s of each cold start in a development environment of ~150 packages,
    spent finding nothing when no plugin package is installed (the usual case). This
    reads the ``entry_points.txt`` of each folder ``importlib.metadata`` would look in
    (``ortgen.installed``) for the group, in a few ms.
    It may say True wrongly (the loader then decides exactly), never False wrongly:
    anything it cannot read as a plain folder (a zip on ``sys.path``, an unreadable
    file) counts as True.
    """
    header = f"[{group}]"
    for folder in metadata_folders():
        if folder is None:  # an egg or a zip: only the loader reads those
            return True
        try:
            with open(os.path.join(folder, "entry_points.txt"), encoding="utf-8") as file:
                if header in file.read():
                    return True
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError):
            return True
    return False


def plugin_name(plugin: object) -> str:
    """A readable name for an in-process plugin: a module's name, else its class's path."""
    if isinstance(plugin, ModuleType):
        return plugin.__name__
    kind = plugin if isinstance(plugin, type) else type(plugin)
    return f"{kind.__module__}.{kind.__qualname__}"


def _register(pm: pluggy.PluginManager, plugin: object, name: str) -> None:
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {name!r} is invalid: {exc}") from exc
    except ValueError as exc:  # registered twice, or under another name already
        raise PluginError(
            f"plugin {name!r} cannot be registered: {exc} (an installed plugin is loaded "
            "through its entry point already; do not pass it to load(plugins=...) as well)"
        ) from exc


def build_registry(pm: pluggy.PluginManager) -> Registry:
    """Call every registration hook once and collect the factories."""
    registry = Registry()
    for kind, hook_name in KINDS.items():
        hook = getattr(pm.hook, hook_name)
        for impl in hook.get_hookimpls():
            owner = pm.get_name(impl.plugin) or repr(impl.plugin)
            register = partial(_add, registry, kind, owner)
            try:
                impl.function(register)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"plugin {owner!r} failed in {hook_name}: {type(exc).__name__}: {exc}"
                ) from exc
    return registry


def _add(registry: Registry, kind: str, plugin: str, name: str, factory, *, replace=False):
    registry.register(kind, name, factory, plugin=plugin, replace=replace)
