"""Build a plugin manager and fill a registry from it, one plugin's failure at a time.

Built-ins (``ortgen.plugins.BUILTIN_PLUGINS``), installed packages (the ``ortgen``
entry-point group) and in-process plugins (``load(plugins=[...])``, ``--plugin``) end in
the same ``pm.register``; nothing happens at import time, so every caller gets a fresh,
independent manager.

Who pays for a failure depends on who asked for the plugin:

- an **installed** plugin is in every process of the environment, asked for by nobody
  in particular: when it fails to import, to validate, or to register (a hook raises, a
  bad or taken name), it is skipped whole, with one :class:`BrokenPluginWarning` naming
  its distribution and entry point, and listed as broken by ``ortgen plugins``. A command
  that does not use it runs as if it were not installed.
- a **built-in** is part of ortgen and an **in-process** plugin was asked for by this
  very call: their failures raise :class:`~ortgen.PluginError`, one line naming them.

The same plugin object registered twice (an installed module also passed in
``plugins=[...]``) is registered once, silently, under its first name: both requests
ask for the same hooks, and running them twice could only fail. pytest skips a plugin
asked for again by the *same name* but lets pluggy raise for the same module under a
*different* name, which is exactly the installed-and-passed case (tach-org/tach#922); the
object is what matters, so ortgen compares objects.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any, NamedTuple

import pluggy

from ..errors import PluginError
from . import hookspecs
from .registry import KINDS, Registry
from .sources import (
    EntryPoint,
    describe_exception,
    entry_points,
    entry_points_may_exist,
    import_plugin,
)

__all__ = [
    "BUILTIN_PACKAGE",
    "DISABLE_ENV",
    "ENTRY_POINT_GROUP",
    "BrokenPluginWarning",
    "PluginInfo",
    "PluginManager",
    "build_registry",
    "import_plugin",
    "make_plugin_manager",
    "plugin_name",
]

ENTRY_POINT_GROUP = "ortgen"
#: the package whose ``BUILTIN_PLUGINS`` lists the built-in plugin modules
BUILTIN_PACKAGE = "ortgen.plugins"
#: comma-separated entry-point names of installed plugins to skip, like pluggy's
#: ``set_blocked``; it never disables a built-in (see ``_env_disabled``)
DISABLE_ENV = "ORTGEN_DISABLE_PLUGINS"

BUILTIN, INSTALLED, IN_PROCESS, UNKNOWN = "built-in", "installed", "in-process", "unknown"


class BrokenPluginWarning(UserWarning):
    """An installed plugin was skipped because it failed; the rest of ortgen works.

    A warning, not a log record: the ``ortgen`` command prints each warning once on
    stderr as ``ortgen: warning: ...``, Python shows it once per process by default, and
    ``warnings.filterwarnings("ignore", category=BrokenPluginWarning)`` silences it."""


@dataclass(frozen=True)
class PluginInfo:
    """One plugin as ``ortgen plugins`` reports it.

    ``origin``: built-in, installed, in-process, or unknown (a disabled name that no
    plugin has). ``status``: loaded, disabled or broken. ``source``: for an installed
    plugin, its distribution and entry point. ``cause``: why it is disabled (who
    disabled it) or broken (what failed)."""

    name: str
    origin: str
    status: str
    source: str | None = None
    cause: str | None = None


class PluginManager(pluggy.PluginManager):
    """pluggy's manager with ortgen's hook specs, knowing where each plugin came from
    and what became of it (loaded, disabled, broken), so failures can be charged to the
    right plugin and ``ortgen plugins`` can show them."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        self._infos: list[PluginInfo] = []  # in the order plugins were seen
        self._disabled_by: dict[str, str] = {}  # name -> who disabled it

    def plugin_infos(self) -> list[PluginInfo]:
        """Every plugin seen, in registration order, then disabled names no plugin had."""
        seen = {info.name for info in self._infos}
        unmatched = [
            PluginInfo(name, UNKNOWN, "disabled", cause=by)
            for name, by in self._disabled_by.items()
            if name not in seen
        ]
        return [*self._infos, *unmatched]

    def info(self, name: str) -> PluginInfo | None:
        """The loaded plugin registered as ``name``, if any."""
        return next((i for i in self._infos if i.name == name and i.status == "loaded"), None)

    def disable(self, name: str, by: str) -> None:
        """Skip the plugins named ``name``, noting ``by``: any plugin (pluggy's
        ``set_blocked``), or only an installed one when ``by`` is the environment, whose
        names are entry-point names (a ``--plugin`` module of that name still loads)."""
        self._disabled_by.setdefault(name, by)
        if by != DISABLE_ENV:
            self.set_blocked(name)

    def entry_point_disabled(self, name: str) -> bool:
        """Whether an installed plugin named ``name`` is skipped before its import."""
        return name in self._disabled_by

    def note_disabled(self, name: str, origin: str, source: str | None = None) -> None:
        """A plugin that was not even imported because ``name`` is disabled."""
        why = self._disabled_by.get(name, "disabled")
        self._infos.append(PluginInfo(name, origin, "disabled", source, why))

    def add(self, plugin: object, name: str, origin: str, source: str | None = None) -> None:
        """Register ``plugin`` as ``name``, or charge the failure to it (see the module)."""
        if plugin is None:
            return self.fail(name, origin, source, "its entry point gave None, not a plugin")
        if self.is_registered(plugin):  # the same object again: once is enough
            return None
        if self.is_blocked(name):
            return self.note_disabled(name, origin, source)
        if self.has_plugin(name):
            holder = self.info(name)
            hint = (
                f"disable the installed one (disable_plugins=[{name!r}]) to use this one"
                if holder is not None and holder.origin == INSTALLED and origin != INSTALLED
                else "two plugin objects cannot share a name"
            )
            return self.fail(
                name, origin, source,
                f"its name is taken by another plugin object: {self.describe(name)}; {hint}",
            )  # fmt: skip
        try:
            self.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            if self.is_registered(plugin):  # pluggy < 1.6 validated after registering
                self.unregister(plugin)
            return self.fail(name, origin, source, f"it is invalid: {_one_line(str(exc))}")
        unknown = [
            caller.name
            for caller in self.get_hookcallers(plugin) or ()
            if not caller.has_spec()
            and any(i.plugin is plugin and not i.optionalhook for i in caller.get_hookimpls())
        ]
        if unknown:
            self.unregister(plugin)
            return self.fail(
                name, origin, source,
                f"it implements {', '.join(map(repr, unknown))}, which is not an ortgen hook "
                f"(those are {', '.join(KINDS.values())})",
            )  # fmt: skip
        self._infos.append(PluginInfo(name, origin, "loaded", source))
        return None

    def fail(self, name: str, origin: str, source: str | None, why: str) -> None:
        """A plugin that could not be registered (or was unregistered after its hooks
        failed): an installed one is skipped with one warning, any other raises."""
        if origin != INSTALLED:
            raise PluginError(f"{_describe(name, origin, source)}: {why}")
        broken = PluginInfo(name, origin, "broken", source, why)
        loaded = self.info(name)
        if loaded is not None and loaded.source == source and not self.has_plugin(name):
            self._infos[self._infos.index(loaded)] = broken  # its hooks failed
        else:
            self._infos.append(broken)
        fix = (
            f"fix or uninstall its package, or set {DISABLE_ENV}={name} to skip it without "
            "this warning"
        )
        warnings.warn(
            f"skipped {_describe(name, origin, source)}: {why}; {fix}",
            BrokenPluginWarning,
            stacklevel=2,
        )

    def describe(self, name: str) -> str:
        """The loaded plugin ``name`` with its origin, for messages naming two plugins."""
        info = self.info(name)
        return _describe(name, info.origin, info.source) if info else f"plugin {name!r}"


def _describe(name: str, origin: str, source: str | None) -> str:
    if origin == INSTALLED:
        return f"installed plugin {name!r} ({source})" if source else f"installed plugin {name!r}"
    if origin == BUILTIN:
        return f"built-in plugin {name!r}"
    return f"plugin {name!r}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def make_plugin_manager(
    *, load_entry_points: bool = True, disable: Iterable[str] = (), extra: Iterable[object] = ()
) -> PluginManager:
    """A manager with the built-ins, installed plugins and ``extra`` plugin objects.

    ``disable`` blocks plugins by name (module name for built-ins, entry-point name for
    installed packages) before they are loaded; ``$ORTGEN_DISABLE_PLUGINS`` blocks
    installed plugins by entry-point name, for every load of the process.
    """
    # imported by name, as an entry point is: the host does not depend on its plugins
    builtins: tuple[str, ...] = importlib.import_module(BUILTIN_PACKAGE).BUILTIN_PLUGINS
    pm = PluginManager()
    for name in disable:
        pm.disable(name, "disable_plugins")
    for module_name in builtins:
        if pm.is_blocked(module_name):
            pm.note_disabled(module_name, BUILTIN)  # never imported
        else:
            pm.add(importlib.import_module(module_name), module_name, BUILTIN)
    if load_entry_points:
        for name in _env_disabled(builtins):
            pm.disable(name, DISABLE_ENV)
        if entry_points_may_exist(ENTRY_POINT_GROUP):
            for entry_point in entry_points(ENTRY_POINT_GROUP):
                _add_entry_point(pm, entry_point)
    for plugin in extra:
        pm.add(plugin, plugin_name(plugin), IN_PROCESS)
    return pm


def _env_disabled(builtins: tuple[str, ...]) -> list[str]:
    """The names in ``$ORTGEN_DISABLE_PLUGINS``: entry-point names, so they block installed
    plugins only (``PluginManager.disable``), never a built-in.

    The variable outlives any one command (a shell profile, a service unit), and a
    built-in disabled for good takes away a sampler or the cache every generation needs;
    disabling a built-in is a choice made per load (``disable_plugins=[...]``, a
    pipeline's ``[plugins] disable``). A built-in's name there gets a warning saying so."""
    names = [n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()]
    for name in names:
        if name in builtins or name.startswith(BUILTIN_PACKAGE + "."):
            warnings.warn(
                f"{DISABLE_ENV} names {name!r}, a built-in module, which it does not disable: "
                "it takes installed plugins' entry-point names (see `ortgen plugins`); "
                "disable a built-in for one load with disable_plugins=[...] or a pipeline's "
                "[plugins] disable",
                stacklevel=3,
            )
    return names


def _add_entry_point(pm: PluginManager, entry_point: EntryPoint) -> None:
    name, source = entry_point.name, entry_point.source
    if pm.entry_point_disabled(name):  # never imported: this also gets around a broken import
        pm.note_disabled(name, INSTALLED, source)
        return
    if pm.has_plugin(name):  # a second distribution with the same entry-point name
        pm.fail(
            name, INSTALLED, source,
            f"its entry-point name is taken by {pm.describe(name)}; uninstall one of them",
        )  # fmt: skip
        return
    try:
        plugin = entry_point.load()
    except (Exception, SystemExit) as exc:  # its import failed: skip it, not the command
        pm.fail(name, INSTALLED, source, f"importing it failed: {describe_exception(exc)}")
        return
    pm.add(plugin, name, INSTALLED, source)


def plugin_name(plugin: object) -> str:
    """A readable name for an in-process plugin: a module's name, else its class's path."""
    if isinstance(plugin, ModuleType):
        return plugin.__name__
    kind = plugin if isinstance(plugin, type) else type(plugin)
    return f"{kind.__module__}.{kind.__qualname__}"


class _Registration(NamedTuple):
    kind: str
    owner: str  # the plugin's name
    name: str
    factory: Any
    replace: bool


def build_registry(pm: pluggy.PluginManager) -> Registry:
    """Call every registration hook once and collect the factories.

    Two passes, so a plugin that fails leaves nothing behind: first every hook runs and
    its ``register`` calls are recorded (a hook that raises charges its plugin), then the
    records fill the registry in order (a bad name, or one taken without
    ``replace=True``, charges the plugin that registered it second). A charged installed
    plugin is skipped whole and the registry refilled without it; any other plugin's
    failure raises PluginError."""
    records = _collect(pm)
    while True:
        registry = Registry()
        for record in records:
            try:
                registry.register(
                    record.kind, record.name, record.factory,
                    plugin=record.owner, replace=record.replace,
                )  # fmt: skip
            except PluginError as exc:
                if not _skip_installed(pm, record.owner, str(exc)):
                    raise
                records = [r for r in records if r.owner != record.owner]
                break
        else:
            return registry


def _collect(pm: pluggy.PluginManager) -> list[_Registration]:
    """What every plugin registers, in the order the registry receives it."""
    records: list[_Registration] = []
    for kind, hook_name in KINDS.items():
        hook = getattr(pm.hook, hook_name)
        for impl in hook.get_hookimpls():
            owner = pm.get_name(impl.plugin) or repr(impl.plugin)
            mine: list[_Registration] = []
            try:
                impl.function(partial(_record, mine, kind, owner))
            except Exception as exc:
                cause = describe_exception(exc)
                if not _skip_installed(pm, owner, f"{hook_name} raised {cause}"):
                    raise PluginError(f"plugin {owner!r} failed in {hook_name}: {cause}") from exc
                records = [r for r in records if r.owner != owner]
                continue
            records.extend(mine)
    return records


def _record(
    into: list[_Registration], kind: str, owner: str, name: Any, factory: Any, *,
    replace: bool = False,
) -> None:  # fmt: skip
    """The ``register(name, factory, *, replace=False)`` callback a hook receives."""
    into.append(_Registration(kind, owner, name, factory, replace))


def _skip_installed(pm: pluggy.PluginManager, owner: str, why: str) -> bool:
    """Unregister and skip ``owner`` with one warning if it is an installed plugin (True);
    False for any other, whose failure the caller raises."""
    if not isinstance(pm, PluginManager):
        return False
    info = pm.info(owner)
    if info is None or info.origin != INSTALLED:
        return False
    pm.unregister(name=owner)
    pm.fail(owner, INSTALLED, info.source, why)
    return True
