"""Pipeline files: a TOML file that is the "pipeline" layer of the generation config.

```toml
model = "exported_models/smollm2-135m-instruct"   # optional: the default model otherwise

[generation]          # any generation setting (docs/config.md)
max_new_tokens = 64
temperature = 0.7
do_sample = true

[sampler]             # and [cache]: one component, name = "..." plus its parameters
name = "multinomial"

[[logits_processors]] # and [[stopping_criteria]]: a list of components, in order
name = "top_p"
top_p = 0.9

[plugins]
disable = ["example"] # plugins not to load

[run]                 # options of `ortgen run`
batch_size = 8

[output]              # the answer is JSON: a schema file (beside this one) or table
json_schema = "person.json"   # or json_object = true
```

``[run]`` also takes ``window``, ``engine`` ("local" or "ray"), and for the ray engine
``address`` and ``workers``. ``[output]`` sets the ``json_schema`` (or ``json_object``)
setting of the pipeline layer, with the schema read when the file is loaded, so the
pipeline carries it wherever it goes (a Ray worker's folder is not this one).

The file is read and checked when it is loaded, and every problem is reported at once
with its location (``logits_processors[2] (top_p): unexpected 'k'; accepts top_p,
min_tokens_to_keep``). Components come only from registered plugins: a pipeline file
names components, it cannot import modules.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..plugin_host.registry import Registry, did_you_mean
from ..structured.check import check_constraint
from ..structured.settings import CONSTRAINT_FIELDS, constraint
from .fields import (
    COMPONENT_KINDS,
    COMPONENT_LISTS,
    FIELDS,
    IGNORED_HF_FIELDS,
    UNSUPPORTED_HF_FIELDS,
)
from .layers import resolve

__all__ = ["Pipeline", "RunOptions", "load_pipeline"]

#: Component tables: TOML key -> (registry kind, one component or a list)
_COMPONENTS = {key: (kind, key in COMPONENT_LISTS) for key, kind in COMPONENT_KINDS.items()}
_TOP_LEVEL = ("model", "generation", "plugins", "run", "output", *_COMPONENTS)
_OUTPUT_KEYS = ("json_schema", "json_object")
_RUN_DEFAULTS: dict[str, Any] = {
    "batch_size": 8,
    "engine": "local",
    "window": 256,
    "address": None,
    "workers": 1,
}
ENGINES = ("local", "ray")


@dataclass(frozen=True)
class RunOptions:
    """``[run]``: how ``ortgen run`` works through an input file."""

    batch_size: int = 8  # rows per generate call
    engine: str = "local"  # "local" or "ray"
    window: int = 256  # rows read ahead and sorted by length, for less padding
    address: str | None = None  # ray engine: the cluster to join (None: a local Ray)
    workers: int = 1  # ray engine: actors, each with the model loaded once


@dataclass(frozen=True)
class Pipeline:
    """A checked pipeline file: the model, the pipeline config layer, plugins, run options."""

    path: Path | None = None
    model: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # the "pipeline" layer
    disable_plugins: tuple[str, ...] = ()
    run: RunOptions = field(default_factory=RunOptions)
    #: what ``[output]`` set: ``{"json_schema": {...}}`` or ``{"json_object": True}``
    #: (also in ``settings``), or nothing
    output: dict[str, Any] = field(default_factory=dict)

    def model_path(self) -> Path | None:
        """``model``, relative to the pipeline file's folder when it is not absolute and
        does not exist from the current directory."""
        if self.model is None:
            return None
        candidate = Path(self.model).expanduser()
        if candidate.is_absolute() or _exists(candidate) or self.path is None:
            return candidate
        beside = self.path.parent / candidate
        return beside if _exists(beside) else candidate


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; a name the system refuses (too long, say) names nothing."""
    try:
        return path.exists()
    except OSError:
        return False


#: what a pipeline's components are checked against: a registry, or a function that
#: makes one from the file's ``[plugins] disable`` list (``load()``: the generator's own)
RegistryArg = Registry | Callable[[tuple[str, ...]], Registry] | None


def load_pipeline(
    source: str | Path | Mapping[str, Any], *, registry: RegistryArg = None
) -> Pipeline:
    """Read and check a pipeline file (or an already parsed mapping); one ConfigError
    lists every problem with its location.

    Named components are checked against ``registry`` — a generator's own, which knows
    its in-process plugins (``load(pipeline=..., plugins=[...])`` passes a function that
    builds it from the file's ``disable`` list) — or, when None, against the built-ins
    and installed plugins less that list."""
    path: Path | None = None
    if isinstance(source, Mapping):
        data: Mapping[str, Any] = source
        where = "pipeline"
    else:
        path = Path(source)
        where = str(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"pipeline file {path} does not exist") from None
        except OSError as exc:
            raise ConfigError(f"cannot read pipeline file {path}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: TOML syntax error: {exc}") from None
    problems: list[str] = []
    pipeline = _check(data, path, problems, registry)
    if problems:
        head = f"invalid pipeline {where}"
        if len(problems) == 1:
            raise ConfigError(f"{head}: {problems[0]}")
        raise ConfigError(head + ":\n" + "\n".join(f"  - {p}" for p in problems))
    return pipeline


def _check(
    data: Mapping[str, Any], path: Path | None, problems: list[str], registry: RegistryArg
) -> Pipeline:
    for key in data:
        if key not in _TOP_LEVEL:
            hint = did_you_mean(key, list(_TOP_LEVEL))
            if key in FIELDS:
                hint = f" (generation settings go under [generation]: [generation] {key} = ...)"
            problems.append(f"unknown key {key!r}{hint}; a pipeline has {', '.join(_TOP_LEVEL)}")
    model = data.get("model")
    if model is not None and not (isinstance(model, str) and model):
        problems.append(f"model must be a folder path (a string), got {model!r}")
    settings = _generation(data.get("generation", {}), problems)
    disable = _plugins(data.get("plugins", {}), problems)
    for key, (kind, many) in _COMPONENTS.items():
        if key in data:
            spec = _components(key, kind, many, data[key], problems)
            if spec is not None:
                settings[key] = spec
    run = _run(data.get("run", {}), problems)
    output = _output(data["output"], path, settings, problems) if "output" in data else {}
    settings.update(output)
    if not problems:
        try:  # the values, checked exactly as the config layer will check them
            config = resolve([("pipeline", settings)]).config
        except ConfigError as exc:
            problems.extend(_relocate(str(exc), output))
        else:
            problems.extend(_constraint_problems(config, output))
    if not problems:
        _check_components(settings, disable, problems, registry)
    return Pipeline(path, model, settings, disable, run, output)


def _generation(table: Any, problems: list[str]) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        problems.append(f"[generation] must be a table of settings, got {table!r}")
        return {}
    out = {}
    for key, value in table.items():
        if key in _COMPONENTS:
            problems.append(
                f"[generation] {key}: components are tables of their own "
                f"({'[[' + key + ']]' if _COMPONENTS[key][1] else '[' + key + ']'} name = ...)"
            )
        elif key in FIELDS or key in IGNORED_HF_FIELDS or key in UNSUPPORTED_HF_FIELDS:
            out[key] = value
        else:
            problems.append(f"[generation] {key}: unknown setting{did_you_mean(key, list(FIELDS))}")
    return out


def _plugins(table: Any, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(table, Mapping):
        problems.append(f"[plugins] must be a table, got {table!r}")
        return ()
    for key in table:
        if key != "disable":
            problems.append(f"[plugins] {key}: unknown key{did_you_mean(key, ['disable'])}")
    disable = table.get("disable", [])
    if not isinstance(disable, list) or not all(isinstance(d, str) for d in disable):
        problems.append(f"[plugins] disable must be a list of plugin names, got {disable!r}")
        return ()
    return tuple(disable)


def _components(key: str, kind: str, many: bool, value: Any, problems: list[str]) -> Any:
    items = value if many else [value]
    if many and not isinstance(value, list):
        problems.append(f"{key} must be an array of tables ([[{key}]] name = ...), got {value!r}")
        return None
    specs = []
    for i, item in enumerate(items):
        where = f"{key}[{i}]" if many else key
        if isinstance(item, str) and item:
            item = {"name": item}
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            problems.append(f'{where}: a {kind} needs name = "..." (and its parameters)')
            continue
        specs.append(dict(item))
    return specs if many else (specs[0] if specs else None)


def _run(table: Any, problems: list[str]) -> RunOptions:
    if not isinstance(table, Mapping):
        problems.append(f"[run] must be a table, got {table!r}")
        return RunOptions()
    values = dict(_RUN_DEFAULTS)
    for key, value in table.items():
        if key not in _RUN_DEFAULTS:
            problems.append(f"[run] {key}: unknown option{did_you_mean(key, list(_RUN_DEFAULTS))}")
            continue
        values[key] = value
    address = values["address"]
    if address is not None and not (isinstance(address, str) and address):
        problems.append(f"[run] address must be HOST:PORT (a string), got {address!r}")
        values["address"] = None
    for key in ("batch_size", "window", "workers"):
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"[run] {key} must be an integer >= 1, got {value!r}")
            values[key] = _RUN_DEFAULTS[key]
    if values["engine"] != "ray" and (values["address"] is not None or values["workers"] != 1):
        problems.append('[run] address and workers are for the ray engine: set engine = "ray"')
    if values["engine"] not in ENGINES:
        problems.append(
            f"[run] engine must be one of {', '.join(ENGINES)}, got {values['engine']!r}"
        )
        values["engine"] = "local"
    return RunOptions(**values)


def _output(
    table: Any, path: Path | None, settings: Mapping[str, Any], problems: list[str]
) -> dict[str, Any]:
    """``[output]``: the answer's JSON shape, as the setting it stands for."""
    if not isinstance(table, Mapping):
        problems.append(
            f"[output] must be a table (json_schema = ... or json_object = true), got {table!r}"
        )
        return {}
    unknown = [key for key in table if key not in _OUTPUT_KEYS]
    for key in unknown:
        hint = did_you_mean(key, list(_OUTPUT_KEYS))
        if key in CONSTRAINT_FIELDS:
            hint = f" ({key} is a generation setting: [generation] {key} = ...)"
        problems.append(
            f"[output] {key}: unknown key{hint}; [output] takes json_schema or json_object"
        )
    given = [key for key in _OUTPUT_KEYS if key in table]
    if len(given) != 1:
        if not unknown:  # else the unknown key already says what is wrong
            what = "has both json_schema and json_object" if given else "is empty"
            problems.append(
                f"[output] {what}: give exactly one of json_schema (a .json file "
                "or an inline table) and json_object = true"
            )
        return {}
    clash = [key for key in CONSTRAINT_FIELDS if settings.get(key) not in (None, False)]
    if clash:
        problems.append(
            f"[output] {given[0]} and [generation] {clash[0]} both constrain the "
            "answer, and a request follows one: keep one"
        )
    if given == ["json_object"]:
        if table["json_object"] is not True:
            problems.append(
                "[output] json_object must be true (false asks for nothing: leave "
                f"[output] out), got {table['json_object']!r}"
            )
            return {}
        return {"json_object": True}
    schema = _output_schema(table["json_schema"], path, problems)
    return {} if schema is None else {"json_schema": schema}


def _output_schema(value: Any, path: Path | None, problems: list[str]) -> Any:
    """An inline table (or JSON text) as it is; a file's JSON object, the file found
    beside the pipeline file (a pipeline given as a mapping: from the current folder)."""
    if isinstance(value, Mapping) or (isinstance(value, str) and value.lstrip()[:1] == "{"):
        return value  # checked as a json_schema setting, with the other settings
    if not isinstance(value, str) or not value:
        problems.append(
            f"[output] json_schema must be a .json file's path or an inline table "
            f"of the schema, got {value!r}"
        )
        return None
    where = Path(value).expanduser()
    beside = ""
    if not where.is_absolute() and path is not None:
        where = path.parent / where
        beside = " (a relative path is read from the pipeline file's folder)"
    try:
        found = where.is_file()
    except OSError as exc:  # a name the system refuses (too long, say)
        shown = value if len(value) <= 60 else value[:57] + "..."
        problems.append(f"[output] json_schema: {shown!r} is no file name: {exc.strerror}")
        return None
    if not found:
        problems.append(f"[output] json_schema: no file {where}{beside}")
        return None
    try:
        schema = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"[output] json_schema: cannot read {where}: {exc}")
        return None
    except ValueError as exc:
        problems.append(f"[output] json_schema: {where} is not JSON: {exc}")
        return None
    if not isinstance(schema, dict):
        problems.append(
            f"[output] json_schema: {where} holds a JSON {type(schema).__name__}; "
            "a JSON Schema is an object"
        )
        return None
    return schema


def _constraint_problems(config: Any, output: Mapping[str, Any]) -> list[str]:
    """The pipeline's structured-output constraint, compiled now (without the model), so
    a broken schema fails the file's load and not every request."""
    found = constraint(config)
    if found is None:
        return []
    try:
        check_constraint(*found)
    except ConfigError as exc:
        return [f"[{'output' if found[0] in output else 'generation'}] {exc}"]
    return []


def _relocate(message: str, output: Mapping[str, Any]) -> list[str]:
    """resolve()'s problems, each placed under [generation] (or its component table, or
    [output] for the setting [output] stands for)."""
    body = message.removeprefix("invalid generation config:").strip()
    lines = [line.strip().removeprefix("- ") for line in body.splitlines() if line.strip()]
    out = []
    for line in lines:
        key = line.split(" ", 1)[0].split("=", 1)[0]
        table = key if key in _COMPONENTS else "output" if key in output else "generation"
        out.append(f"[{table}] {line}" if key in FIELDS else line)
    return out


def _check_components(
    settings: Mapping[str, Any],
    disable: tuple[str, ...],
    problems: list[str],
    registry: RegistryArg,
) -> None:
    """Each named component exists among the registered plugins and takes its parameters."""
    if callable(registry) and not isinstance(registry, Registry):
        try:
            registry = registry(disable)
        except Exception as exc:  # a broken plugin: say so, with the rest
            problems.append(f"plugins could not be loaded: {exc}")
            return
    if registry is None:
        from ..plugin_host.manager import build_registry, make_plugin_manager

        try:
            registry = build_registry(make_plugin_manager(disable=disable))
        except Exception as exc:  # a broken plugin: say so, with the rest
            problems.append(f"plugins could not be loaded: {exc}")
            return
    for key, (kind, many) in _COMPONENTS.items():
        if key not in settings:
            continue
        specs = settings[key] if many else [settings[key]]
        for i, spec in enumerate(specs):
            name = spec["name"]
            params = {k: v for k, v in spec.items() if k != "name"}
            where = f"{key}[{i}] ({name})" if many else f"{key} ({name})"
            for problem in registry.problems(kind, name, params):
                problems.append(f"{where}: {problem}")
    chat_format = settings.get("chat_format")
    if isinstance(chat_format, str):  # a name, not a component table: one setting
        for problem in registry.problems("chat_format", chat_format, {}):
            problems.append(f"[generation] chat_format: {problem}")
