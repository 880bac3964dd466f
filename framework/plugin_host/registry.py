"""Named component factories, one table per component kind.

Plugins fill the tables through the registration hooks; configs and pipeline
files pick entries by name. The registry is where duplicate names, unknown
names and bad parameters are caught, with errors that say which plugin and
which names exist.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, PluginError

#: Component kinds, each with the hook that registers it.
KINDS: dict[str, str] = {
    "logits_processor": "register_logits_processors",
    "sampler": "register_samplers",
    "stopping_criterion": "register_stopping_criteria",
    "kv_cache": "register_kv_caches",
    "drafter": "register_drafters",
    "chat_format": "register_chat_formats",
}


@dataclass(frozen=True)
class Entry:
    """One registered factory and where it came from."""

    kind: str
    name: str
    factory: Callable[..., Any]
    plugin: str

    @property
    def wants_ctx(self) -> bool:
        return "ctx" in _parameters(self.factory)

    def parameters(self) -> dict[str, inspect.Parameter]:
        """The factory's keyword parameters, without ``ctx``."""
        return {k: p for k, p in _parameters(self.factory).items() if k != "ctx"}


def _parameters(factory: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(factory).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return {}


def did_you_mean(name: str, choices: list[str]) -> str:
    """A ' (did you mean X?)' hint, or '' when nothing is close."""
    close = difflib.get_close_matches(name, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Registry:
    """Factories by kind and name."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}

    def register(
        self,
        kind: str,
        name: str,
        factory: Callable[..., Any],
        *,
        plugin: str,
        replace: bool = False,
    ) -> None:
        """Add a factory; a second use of a name is an error unless ``replace``."""
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {plugin!r} registered a {kind} with a bad name: {name!r}")
        if not callable(factory):
            raise PluginError(
                f"plugin {plugin!r} registered {kind} {name!r} with a factory that is not "
                f"callable: {factory!r}"
            )
        table = self._entries[kind]
        if name in table and not replace:
            raise PluginError(
                f"{kind} {name!r} is registered twice: by plugin {table[name].plugin!r} and by "
                f"plugin {plugin!r}; pass replace=True to register() to override it on purpose, "
                f"or disable one plugin"
            )
        table[name] = Entry(kind, name, factory, plugin)

    def names(self, kind: str) -> list[str]:
        return sorted(self._entries[kind])

    def entries(self, kind: str) -> list[Entry]:
        return [self._entries[kind][n] for n in self.names(kind)]

    def in_order(self, kind: str) -> list[Entry]:
        """The entries of ``kind`` in the order they were registered (built-ins first,
        each plugin's in its own order): where that order means something, as the
        order chat formats are matched against a template."""
        return list(self._entries[kind].values())

    def get(self, kind: str, name: str) -> Entry:
        table = self._entries[kind]
        if name not in table:
            known = sorted(table)
            raise ConfigError(
                f"unknown {kind} {name!r}{did_you_mean(name, known)}; registered: "
                f"{', '.join(known) or 'none'}"
            )
        return table[name]

    def problems(self, kind: str, name: str, params: Mapping[str, Any]) -> list[str]:
        """What is wrong with ``name`` and ``params`` before anything is created: an
        unknown name, parameters the factory does not take, parameters it needs."""
        table = self._entries[kind]
        if name not in table:
            known = sorted(table)
            return [
                f"unknown {kind} {name!r}{did_you_mean(name, known)}; registered: "
                f"{', '.join(known) or 'none'}"
            ]
        accepted = table[name].parameters()
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
        found = []
        unknown = [k for k in params if k not in accepted and not takes_any]
        if unknown:
            hint = did_you_mean(unknown[0], list(accepted)) if len(unknown) == 1 else ""
            found.append(
                f"unexpected {', '.join(map(repr, unknown))}{hint}; accepts "
                f"{', '.join(accepted) or 'no parameters'}"
            )
        missing = [
            k
            for k, p in accepted.items()
            if p.default is inspect.Parameter.empty
            and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
            and k not in params
        ]
        if missing:
            found.append(f"needs {', '.join(missing)}")
        return found

    def create(self, kind: str, name: str, params: Mapping[str, Any], ctx: Any) -> Any:
        """Call the factory of ``name`` with ``params`` (and ``ctx`` if it asks)."""
        entry = self.get(kind, name)
        found = self.problems(kind, name, params)
        if found:
            raise ConfigError(f"{kind} {name!r}: {'; '.join(found)}")
        kwargs = dict(params)
        if entry.wants_ctx:
            kwargs["ctx"] = ctx
        try:
            return entry.factory(**kwargs)
        except ConfigError:
            raise
        except Exception as exc:  # a plugin's own failure: name it
            raise ConfigError(
                f"{kind} {name!r} (plugin {entry.plugin!r}) could not be created with "
                f"{dict(params)!r}: {type(exc).__name__}: {exc}"
            ) from exc
