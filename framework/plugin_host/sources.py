"""Where a plugin comes from, and how a plugin's failure reads.

Installed plugins are entry points in ortgen's group, found without importing anything
(``entry_points_may_exist``, then ``entry_points``); their import is the manager's, so
that a failure is charged to the plugin.

``--plugin SPEC`` (on ``generate``, ``chat``, ``run``, ``bench``, ``serve`` and
``plugins``) takes an importable module (``my_pkg.plugin``) or a Python file
(``./my_plugin.py``); both become the module object ``load(plugins=[...])`` takes. A file
matters because the ``ortgen`` console script's ``sys.path`` does not hold the current
folder, so a module next to the user is not importable by name.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from ..errors import PluginError
from .installed import metadata_folders

__all__ = [
    "EntryPoint",
    "describe_exception",
    "entry_points",
    "entry_points_may_exist",
    "import_plugin",
]

#: frames of the import machinery, not of the plugin: left out of a failure's location
_MACHINERY = (
    os.path.dirname(importlib.__file__) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
)


def import_plugin(spec: str) -> ModuleType:
    """The module ``--plugin SPEC`` names: a file when SPEC ends in ``.py`` or holds a
    path separator, else a module name imported from ``sys.path``."""
    if spec.endswith(".py") or "/" in spec or os.sep in spec:
        return _import_file(spec)
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (spec == exc.name or spec.startswith(exc.name + ".")):
            raise PluginError(
                f"--plugin {spec}: no module of that name on sys.path (a file is given by "
                f"its path, such as ./{spec.replace('.', '/')}.py)"
            ) from None
        raise PluginError(
            f"--plugin {spec}: importing it failed: {describe_exception(exc)}"
        ) from exc
    except Exception as exc:  # the module exists and fails: say where
        raise PluginError(
            f"--plugin {spec}: importing it failed: {describe_exception(exc)}"
        ) from exc


def _import_file(spec: str) -> ModuleType:
    """A plugin file, imported as the module named by its stem (the plugin's name), once
    per process: asked for again it is the same module, registered once."""
    path = Path(spec).expanduser().resolve()
    if not path.is_file():
        raise PluginError(f"--plugin {spec}: no such file")
    name = path.stem
    if name == "__init__":
        raise PluginError(
            f"--plugin {spec}: a package is given by name (--plugin {path.parent.name}, "
            "with its parent folder on PYTHONPATH), not by its __init__.py"
        )
    if not name.isidentifier():
        raise PluginError(f"--plugin {spec}: {name!r} is not a Python module name; rename the file")
    loaded = sys.modules.get(name)
    if loaded is not None:
        if _same_file(getattr(loaded, "__file__", None), path):
            return loaded
        raise PluginError(
            f"--plugin {spec}: a module named {name!r} is imported already "
            f"({getattr(loaded, '__file__', None) or 'built in'}); rename the file"
        )
    found = importlib.util.find_spec(name)
    if found is not None and not _same_file(found.origin, path):
        raise PluginError(
            f"--plugin {spec}: it would hide the module {name!r} ({found.origin}); rename the file"
        )
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None  # a .py file
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # as an import does: dataclasses and pickle look it up
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise PluginError(
            f"--plugin {spec}: importing it failed: {describe_exception(exc)}"
        ) from exc
    return module


def _same_file(a: str | None, path: Path) -> bool:
    return a is not None and Path(a).resolve() == path


def describe_exception(exc: BaseException) -> str:
    """``Type: message (at file:line)`` on one line, the place being the innermost frame
    outside the import machinery: where a plugin author looks first."""
    text = " ".join(str(exc).split())
    where = ""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(("<frozen", *_MACHINERY))
    ]
    if frames:
        where = f" (at {frames[-1].filename}:{frames[-1].lineno})"
    elif isinstance(exc, SyntaxError) and exc.filename:
        where = f" (at {exc.filename}:{exc.lineno})"
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"


class EntryPoint(NamedTuple):
    """An installed plugin's entry point, read without importing it."""

    name: str
    source: str  # "DIST VERSION, entry point NAME = VALUE", what messages name it by
    load: Callable[[], object]


def entry_points(group: str) -> list[EntryPoint]:
    """The group's entry points, each distribution once (the first on ``sys.path``), as
    Python imports it."""
    import importlib.metadata

    found = []
    for ep in importlib.metadata.entry_points(group=group):
        dist = ep.dist
        where = f"{dist.name} {dist.version}, " if dist is not None else ""
        found.append(EntryPoint(ep.name, f"{where}entry point {ep.name} = {ep.value}", ep.load))
    return found


def entry_points_may_exist(group: str) -> bool:
    """False only when no distribution on ``sys.path`` declares an entry point in ``group``.

    pluggy's loader imports ``importlib.metadata`` and parses every distribution's entry
    points: ~0.09 s of each cold start in a development environment of ~150 packages,
    spent finding nothing when no plugin package is installed (the usual case). This
    reads the ``entry_points.txt`` of each folder ``importlib.metadata`` would look in
    (``ortgen.plugin_host.installed``) for the group, in a few ms.
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
