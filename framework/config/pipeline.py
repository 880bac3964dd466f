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
``address`` and ``workers``; ``task`` ("generate", or "embed": each row's text embedded,
pooled as ``pooling``, ``normalize`` and ``dimensions`` say, as ``gen.embed`` takes them:
``run_options.py``). ``[output]`` sets the ``json_schema`` (or ``json_object``) setting
of the pipeline layer, with the schema read when the file is loaded, so the
pipeline carries it wherever it goes (a Ray worker's folder is not this one).

The file is read and checked when it is loaded, and every problem is reported at once
with its location (``logits_processors[2] (top_p): unexpected 'k'; accepts top_p,
min_tokens_to_keep``): no problem hides another (a ``[generation]`` typo still lets the
values, the components, ``[run]`` and ``[output]`` be checked). ``ConfigError.problems``
gives each as ``(field, message)``, the field its place in the file (``generation.top_p``,
``logits_processors[1]``, ``run.engine``). ``ortgen run`` adds the problems of its
command line to the file's, in one error (``check_pipeline``, ``pipeline_error``).
Components come only from registered plugins: a pipeline file names components, it
cannot import modules.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, Problem
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
from .run_options import ENGINES, RunOptions, read_run

__all__ = [
    "ENGINES",
    "Pipeline",
    "RunOptions",
    "check_pipeline",
    "load_pipeline",
    "pipeline_error",
]

#: Component tables: TOML key -> (registry kind, one component or a list)
_COMPONENTS = {key: (kind, key in COMPONENT_LISTS) for key, kind in COMPONENT_KINDS.items()}
_TOP_LEVEL = ("model", "generation", "plugins", "run", "output", *_COMPONENTS)
_OUTPUT_KEYS = ("json_schema", "json_object")


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
    pipeline, problems = check_pipeline(source, registry=registry)
    if problems:
        raise pipeline_error(source, problems)
    return pipeline


def check_pipeline(
    source: str | Path | Mapping[str, Any], *, registry: RegistryArg = None
) -> tuple[Pipeline, list[Problem]]:
    """The pipeline and every problem of it, without raising: a caller with problems of
    its own (``ortgen run``'s flags) reports them all in one error. A file that cannot be
    read is one problem, and the pipeline then has every default."""
    if isinstance(source, Mapping):
        return _check(source, None, registry)
    path = Path(source)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        why = f"pipeline file {path} does not exist"
    except OSError as exc:
        why = f"cannot read pipeline file {path}: {exc}"
    except UnicodeDecodeError as exc:
        why = f"{path}: not UTF-8 text: {exc}"
    except tomllib.TOMLDecodeError as exc:
        why = f"{path}: TOML syntax error: {exc}"
    else:
        return _check(data, path, registry)
    return Pipeline(path), [(None, why)]


def pipeline_error(
    source: str | Path | Mapping[str, Any] | None,
    problems: Sequence[Problem],
    extra: Sequence[Problem] = (),
) -> ConfigError:
    """One ConfigError for a pipeline's problems and a command line's (``extra``), each
    message on its own line. A file that cannot be read is its own message."""
    where = "pipeline" if source is None or isinstance(source, Mapping) else str(source)
    every = [*problems, *extra]
    unreadable = len(problems) == 1 and problems[0][0] is None and where in problems[0][1]
    if not extra and unreadable:
        return ConfigError(problems[0][1], problems=every)
    if not problems:
        head = "invalid command line"
    elif extra:
        head = f"invalid pipeline {where} and command line"
    else:
        head = f"invalid pipeline {where}"
    if len(every) == 1:
        return ConfigError(f"{head}: {every[0][1]}", problems=every)
    listed = "\n".join(f"  - {message}" for _, message in every)
    return ConfigError(f"{head}:\n{listed}", problems=every)


def _check(
    data: Mapping[str, Any], path: Path | None, registry: RegistryArg
) -> tuple[Pipeline, list[Problem]]:
    """Every part checked, whatever the others hold: a problem in one never hides
    another (the values and components checked are those that could be read)."""
    problems: list[Problem] = []
    for key in data:
        if key not in _TOP_LEVEL:
            hint = did_you_mean(key, list(_TOP_LEVEL))
            if key in FIELDS:
                hint = f" (generation settings go under [generation]: [generation] {key} = ...)"
            problems.append(
                (key, f"unknown key {key!r}{hint}; a pipeline has {', '.join(_TOP_LEVEL)}")
            )
    model = data.get("model")
    if model is not None and not (isinstance(model, str) and model):
        problems.append(("model", f"model must be a folder path (a string), got {model!r}"))
        model = None
    settings = _generation(data.get("generation", {}), problems)
    disable = _plugins(data.get("plugins", {}), problems)
    for key, (kind, many) in _COMPONENTS.items():
        if key in data:
            spec = _components(key, kind, many, data[key], problems)
            if spec is not None:
                settings[key] = spec
    run = read_run(data.get("run", {}), problems)
    output = _output(data["output"], path, settings, problems) if "output" in data else {}
    settings.update(output)
    problems.extend(_value_problems(settings, output))
    _check_components(settings, disable, problems, registry)
    order = {key: i for i, key in enumerate(data)}  # the file's tables, in its order

    def rank(problem: Problem) -> int:
        table = (problem[0] or "").split(".", 1)[0].split("[", 1)[0]
        return order.get(table, len(order))

    return Pipeline(path, model, settings, disable, run, output), sorted(problems, key=rank)


def _value_problems(settings: dict[str, Any], output: Mapping[str, Any]) -> list[Problem]:
    """The values, checked exactly as the config layer will check them, and the
    constraint compiled (on its own when another value is bad, so it is not hidden)."""
    try:
        config = resolve([("pipeline", settings)]).config
    except ConfigError as exc:
        found = [_placed(field, message, output) for field, message in exc.problems]
        alone = {k: v for k, v in settings.items() if k in CONSTRAINT_FIELDS}
        if not alone or any(field in CONSTRAINT_FIELDS for field, _ in exc.problems):
            return found
        try:
            config = resolve([("pipeline", alone)]).config
        except ConfigError:
            return found
        return found + _constraint_problems(config, output)
    return _constraint_problems(config, output)


def _generation(table: Any, problems: list[Problem]) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        problems.append(("generation", f"[generation] must be a table of settings, got {table!r}"))
        return {}
    out = {}
    for key, value in table.items():
        where = f"generation.{key}"
        if key in _COMPONENTS:
            shape = f"[[{key}]]" if _COMPONENTS[key][1] else f"[{key}]"
            own = f"[generation] {key}: components are tables of their own ({shape} name = ...)"
            problems.append((where, own))
        elif key in FIELDS or key in IGNORED_HF_FIELDS or key in UNSUPPORTED_HF_FIELDS:
            out[key] = value
        else:
            hint = did_you_mean(key, list(FIELDS))
            problems.append((where, f"[generation] {key}: unknown setting{hint}"))
    return out


def _plugins(table: Any, problems: list[Problem]) -> tuple[str, ...]:
    if not isinstance(table, Mapping):
        problems.append(("plugins", f"[plugins] must be a table, got {table!r}"))
        return ()
    for key in table:
        if key != "disable":
            hint = did_you_mean(key, ["disable"])
            problems.append((f"plugins.{key}", f"[plugins] {key}: unknown key{hint}"))
    disable = table.get("disable", [])
    if not isinstance(disable, list) or not all(isinstance(d, str) for d in disable):
        message = f"[plugins] disable must be a list of plugin names, got {disable!r}"
        problems.append(("plugins.disable", message))
        return ()
    return tuple(disable)


def _components(key: str, kind: str, many: bool, value: Any, problems: list[Problem]) -> Any:
    items = value if many else [value]
    if many and not isinstance(value, list):
        problems.append(
            (key, f"{key} must be an array of tables ([[{key}]] name = ...), got {value!r}")
        )
        return None
    specs = []
    for i, item in enumerate(items):
        where = f"{key}[{i}]" if many else key
        if isinstance(item, str) and item:
            item = {"name": item}
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            problems.append((where, f'{where}: a {kind} needs name = "..." (and its parameters)'))
            continue
        specs.append(dict(item))
    return specs if many else (specs[0] if specs else None)


def _output(
    table: Any, path: Path | None, settings: Mapping[str, Any], problems: list[Problem]
) -> dict[str, Any]:
    """``[output]``: the answer's JSON shape, as the setting it stands for (nothing when
    it clashes with a constraint under ``[generation]``: that is its one problem)."""
    if not isinstance(table, Mapping):
        message = "[output] must be a table (json_schema = ... or json_object = true)"
        problems.append(("output", f"{message}, got {table!r}"))
        return {}
    unknown = [key for key in table if key not in _OUTPUT_KEYS]
    for key in unknown:
        hint = did_you_mean(key, list(_OUTPUT_KEYS))
        if key in CONSTRAINT_FIELDS:
            hint = f" ({key} is a generation setting: [generation] {key} = ...)"
        message = f"[output] {key}: unknown key{hint}; [output] takes json_schema or json_object"
        problems.append((f"output.{key}", message))
    given = [key for key in _OUTPUT_KEYS if key in table]
    if len(given) != 1:
        if not unknown:  # else the unknown key already says what is wrong
            what = "has both json_schema and json_object" if given else "is empty"
            message = (
                f"[output] {what}: give exactly one of json_schema (a .json file or an "
                "inline table) and json_object = true"
            )
            problems.append(("output", message))
        return {}
    clash = [key for key in CONSTRAINT_FIELDS if settings.get(key) not in (None, False)]
    if clash:
        message = (
            f"[output] {given[0]} and [generation] {clash[0]} both constrain the answer, "
            "and a request follows one: keep one"
        )
        problems.append((f"output.{given[0]}", message))
        return {}
    if given == ["json_object"]:
        if table["json_object"] is not True:
            message = (
                "[output] json_object must be true (false asks for nothing: leave [output] "
                f"out), got {table['json_object']!r}"
            )
            problems.append(("output.json_object", message))
            return {}
        return {"json_object": True}
    schema = _output_schema(table["json_schema"], path, problems)
    return {} if schema is None else {"json_schema": schema}


def _output_schema(value: Any, path: Path | None, problems: list[Problem]) -> Any:
    """An inline table (or JSON text) as it is; a file's JSON object, the file found
    beside the pipeline file (a pipeline given as a mapping: from the current folder)."""

    def bad(message: str) -> None:
        problems.append(("output.json_schema", message))

    if isinstance(value, Mapping) or (isinstance(value, str) and value.lstrip()[:1] == "{"):
        return value  # checked as a json_schema setting, with the other settings
    if not isinstance(value, str) or not value:
        bad(
            f"[output] json_schema must be a .json file's path or an inline table "
            f"of the schema, got {value!r}"
        )
        return None
    beside = ""
    try:  # ~user of no user, a NUL byte, a name too long: the system refuses the name
        where = Path(value).expanduser()
        if not where.is_absolute() and path is not None:
            where = path.parent / where
            beside = " (a relative path is read from the pipeline file's folder)"
        found = where.is_file()
    except (OSError, ValueError, RuntimeError) as exc:
        shown = value if len(value) <= 60 else value[:57] + "..."
        why = getattr(exc, "strerror", None) or str(exc)
        bad(f"[output] json_schema: {shown!r} is no file name: {why}")
        return None
    if not found:
        bad(f"[output] json_schema: no file {where}{beside}")
        return None
    try:
        schema = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        bad(f"[output] json_schema: cannot read {where}: {exc}")
        return None
    except ValueError as exc:
        bad(f"[output] json_schema: {where} is not JSON: {exc}")
        return None
    if not isinstance(schema, dict):
        bad(
            f"[output] json_schema: {where} holds a JSON {type(schema).__name__}; "
            "a JSON Schema is an object"
        )
        return None
    return schema


def _constraint_problems(config: Any, output: Mapping[str, Any]) -> list[Problem]:
    """The pipeline's structured-output constraint, compiled now (without the model), so
    a broken schema fails the file's load and not every request."""
    found = constraint(config)
    if found is None:
        return []
    table = "output" if found[0] in output else "generation"
    try:
        check_constraint(*found)
    except ConfigError as exc:
        return [(f"{table}.{found[0]}", f"[{table}] {exc}")]
    return []


def _placed(field: str | None, message: str, output: Mapping[str, Any]) -> Problem:
    """A problem of resolve(), placed under [generation] (or its component table, or
    [output] for the setting [output] stands for)."""
    key = field or message.split(" ", 1)[0].split("=", 1)[0]
    if key not in FIELDS:
        return (field, message)
    if key in _COMPONENTS:
        return (key, f"[{key}] {message}")
    table = "output" if key in output else "generation"
    return (f"{table}.{key}", f"[{table}] {message}")


def _check_components(
    settings: Mapping[str, Any],
    disable: tuple[str, ...],
    problems: list[Problem],
    registry: RegistryArg,
) -> None:
    """Each named component exists among the registered plugins and takes its parameters."""
    if callable(registry) and not isinstance(registry, Registry):
        try:
            registry = registry(disable)
        except Exception as exc:  # a broken plugin: say so, with the rest
            problems.append(("plugins", f"plugins could not be loaded: {exc}"))
            return
    if registry is None:
        from ..plugin_host.manager import build_registry, make_plugin_manager

        try:
            registry = build_registry(make_plugin_manager(disable=disable))
        except Exception as exc:  # a broken plugin: say so, with the rest
            problems.append(("plugins", f"plugins could not be loaded: {exc}"))
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
                problems.append((f"{key}[{i}]" if many else key, f"{where}: {problem}"))
    chat_format = settings.get("chat_format")
    if isinstance(chat_format, str):  # a name, not a component table: one setting
        for problem in registry.problems("chat_format", chat_format, {}):
            problems.append(("generation.chat_format", f"[generation] chat_format: {problem}"))
