"""Calls written as Python (``[get_weather(city="Paris", days=3)]``): their grammar
built from the functions' JSON Schemas, and their arguments read back as JSON. Part of
the chat-format kit (``ortgen.chat_formats``); the ``pythonic`` format uses it, and any
other format whose family writes Python-style calls can."""

from __future__ import annotations

import ast
import json
import keyword
import math
from collections.abc import Mapping
from typing import Any

from ..errors import InputError

#: one character of the double-quoted Python strings :class:`PythonCallRules` writes
_PY_CHAR = r"""[^"\\\x00-\x1f]|\\["\\'ntr]"""
_NUMERIC = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
#: any Python literal, for what :class:`PythonCallRules` does not follow
_PY_ANY = [
    'pyvalue: PYSTR | PYNUM | "True" | "False" | "None" | pylist | pydict',
    'pylist: "[" (pyvalue (", " pyvalue)*)? "]"',
    'pydict: "{" (PYSTR ": " pyvalue (", " PYSTR ": " pyvalue)*)? "}"',
    f'PYSTR: /"(?:{_PY_CHAR})*"/',
    r"PYNUM: /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,2})?/",
]


def python_literal(value: Any) -> str:
    """A JSON value as the Python literal that means it (``True``, ``None``, ``"x"``,
    ``[1, {"a": None}]``): how a format writes an earlier call back as Python."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(item) for item in value) + "]"
    if isinstance(value, dict):
        pairs = (
            f"{json.dumps(str(k), ensure_ascii=False)}: {python_literal(v)}"
            for k, v in value.items()
        )
        return "{" + ", ".join(pairs) + "}"
    return json.dumps(value, ensure_ascii=False)


class _NotLiteral(Exception):
    """A value that is not one of the literals a call may hold."""


def python_arguments(source: str) -> str | None:
    """A whole Python call's argument list, ``(city="Paris", days=3)``, as JSON text of
    its keyword arguments in the order written, read with :mod:`ast`; None unless every
    argument is a keyword with a literal value: a string, a number (a finite one, signed
    or not), ``True``/``False``/``None``, or a list or dict (string keys) of them. A
    positional argument, ``**mapping``, a name, a call, a tuple or a set is not a call's
    argument (vLLM's pythonic parser reads the same)."""
    try:
        tree = ast.parse("_" + source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    call = tree.body
    if not isinstance(call, ast.Call) or call.args or not isinstance(call.func, ast.Name):
        return None
    values = {}
    try:
        for argument in call.keywords:
            if argument.arg is None:  # **mapping
                return None
            values[argument.arg] = _literal(argument.value)
        text = json.dumps(values, ensure_ascii=False)
        text.encode()  # a lone surrogate ("\ud800") is no JSON text
    except (_NotLiteral, ValueError, RecursionError):
        return None
    return text


def _literal(node: ast.expr) -> Any:
    """The value of a literal (see python_arguments), else _NotLiteral."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _literal(node.operand)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _NotLiteral
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, bool | str | int):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
    elif isinstance(node, ast.List):
        return [_literal(item) for item in node.elts]
    elif isinstance(node, ast.Dict):
        out = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if not isinstance(key, ast.Constant) or not isinstance(key.value, str):
                raise _NotLiteral
            out[key.value] = _literal(value)
        return out
    raise _NotLiteral


def _lark(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text)


def _sequence(members: list[tuple[str, bool]]) -> str:
    """The members (a rule, whether required) in order, separated by ``", "``, each one
    not required possibly left out; "" when there are none."""
    if not members:
        return ""
    required = [index for index, (_, needed) in enumerate(members) if needed]
    last_first = required[0] if required else len(members) - 1

    def tail(start: int) -> str:
        return " ".join(
            f'(", " {rule})' + ("" if needed else "?") for rule, needed in members[start:]
        )

    options = " | ".join(
        f"{members[first][0]} {tail(first + 1)}".strip() for first in range(last_first + 1)
    )
    return f"({options})" + ("" if required else "?")


class PythonCallRules:
    """Lark rules (llguidance's dialect) for calls written as Python,
    ``get_weather(city="Paris", days=3)``, whose keyword arguments follow each
    function's JSON Schema: for formats whose models write calls as Python (``pythonic``).

    :meth:`call` adds the rules of one function's call and returns the rule's name;
    :attr:`lines` are all rules added, to go into the grammar. The keyword arguments come
    in the order of the parameters' ``properties``, separated by ``", "``, the required
    ones always and the others optionally; each value is a Python literal following the
    parameter's schema (what :func:`python_arguments` reads back):

    - ``string``: a double-quoted literal, ``minLength``/``maxLength`` kept (escapes
      ``\\\\`` ``\\"`` ``\\'`` ``\\n`` ``\\t`` ``\\r`` only);
    - ``integer``, ``number``: llguidance's JSON numbers (the same text in Python), with
      ``minimum``, ``maximum``, the exclusive bounds and ``multipleOf``;
    - ``boolean`` (``True``/``False``), ``null`` (``None``), ``enum`` and ``const`` (any
      JSON values, as Python literals), a list of types, ``anyOf``, ``allOf`` of one;
    - ``array``: ``items``, ``minItems``, ``maxItems``;
    - ``object`` as a dict literal: the listed properties in order, the required ones
      always (closed: what every function's parameters are); without ``properties``,
      string keys with values of its ``additionalProperties`` schema;
    - ``$ref`` to ``#``, ``#/$defs/...`` or ``#/definitions/...`` of the parameters.

    Looser (a value may break them): ``pattern``, ``format``, ``uniqueItems``, ``not``,
    ``if``/``then``/``else``, ``minProperties`` and ``maxProperties`` are not enforced;
    ``oneOf`` is written as ``anyOf`` (branches that overlap may both match); ``allOf``
    of several schemas, tuple ``prefixItems``, another ``$ref`` and a schema of none of
    the types above take any Python literal (strings, numbers, ``True``/``False``/``None``,
    lists, dicts); a function whose parameters list no properties takes any keyword
    arguments (values of its ``additionalProperties`` schema). A parameter whose name is
    no Python identifier (or is a keyword, ``class``) cannot be a keyword argument:
    optional, it is left out; required, :meth:`call` raises ``InputError`` naming it.
    """

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._any = False  # whether the any-literal rules are used
        self._refs: dict[tuple[int, str], str] = {}

    @property
    def lines(self) -> list[str]:
        """Every rule added so far (``rN: ...``, and ``pyvalue`` and its own when used)."""
        return self._lines + (_PY_ANY if self._any else [])

    def call(self, name: str, parameters: Mapping[str, Any]) -> str:
        """The rule of one call of ``name`` with arguments following ``parameters``."""
        properties = parameters.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = [key for key in parameters.get("required", ()) if isinstance(key, str)]
        if properties or required:
            members = []
            for key in [*properties, *(k for k in required if k not in properties)]:
                if not key.isidentifier() or keyword.iskeyword(key):
                    if key in required:
                        raise InputError(
                            f"tool {name!r}: the required parameter {key!r} cannot be written "
                            "as a Python keyword argument, as this model's calls are",
                            field="tools",
                        )
                    continue
                value = self.value(properties.get(key, True), parameters)
                members.append((self._rule(f"{_lark(key + '=')} {value}"), key in required))
            arguments = _sequence(members)
        elif parameters.get("additionalProperties") is False:
            arguments = ""
        else:
            value = self.value(parameters.get("additionalProperties", True), parameters)
            pair = self._rule(f'/[A-Za-z_][A-Za-z0-9_]*/ "=" {value}')
            arguments = f'({pair} (", " {pair})*)?'
        return self._rule(f"{_lark(name + '(')} {arguments} {_lark(')')}")

    def value(self, schema: Any, root: Mapping[str, Any]) -> str:
        """A Lark expression for one value following ``schema`` (``root``: what ``$ref``
        points into)."""
        if not isinstance(schema, Mapping):
            return self._any_value()
        if isinstance(schema.get("$ref"), str):
            return self._ref(schema["$ref"], root)
        if "const" in schema:
            return _lark(python_literal(schema["const"]))
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self._rule(" | ".join(_lark(python_literal(v)) for v in schema["enum"]))
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                rest = {k: v for k, v in schema.items() if k != key}
                branches = [
                    self.value({**rest, **branch}, root)
                    for branch in schema[key]
                    if isinstance(branch, Mapping)
                ]
                return self._rule(" | ".join(branches)) if branches else self._any_value()
        if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) == 1:
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            return self.value({**rest, **schema["allOf"][0]}, root)
        kind = schema.get("type")
        if isinstance(kind, list):
            kinds = [self.value({**schema, "type": k}, root) for k in kind if isinstance(k, str)]
            return self._rule(" | ".join(kinds)) if kinds else self._any_value()
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else None
        if "allOf" in schema:  # of several schemas
            return self._any_value()
        if kind == "string":
            return self._string(schema)
        if kind in ("integer", "number"):
            bounds = {k: schema[k] for k in _NUMERIC if _is_number(schema.get(k))}
            return self._rule("%json " + json.dumps({"type": kind, **bounds}))
        if kind == "boolean":
            return '("True" | "False")'
        if kind == "null":
            return '"None"'
        if kind == "array":
            return self._array(schema, root)
        if kind == "object":
            return self._object(schema, root)
        return self._any_value()

    def _rule(self, body: str) -> str:
        name = f"r{len(self._lines)}"
        self._lines.append(f"{name}: {body}")
        return name

    def _any_value(self) -> str:
        self._any = True
        return "pyvalue"

    def _string(self, schema: Mapping[str, Any]) -> str:
        low = schema.get("minLength", 0)
        high = schema.get("maxLength")
        low = low if isinstance(low, int) and low > 0 else 0
        if isinstance(high, int) and high >= low:
            count = f"{{{low},{high}}}"
        else:
            count = f"{{{low},}}" if low else "*"
        return self._rule(f'/"(?:{_PY_CHAR}){count}"/')

    def _array(self, schema: Mapping[str, Any], root: Mapping[str, Any]) -> str:
        items = schema.get("items")
        if "prefixItems" in schema or isinstance(items, list):  # tuples: any values
            item = self._any_value()
        else:
            item = self.value(items if items is not None else True, root)
        low = schema.get("minItems", 0)
        low = low if isinstance(low, int) and low > 0 else 0
        high = schema.get("maxItems")
        if isinstance(high, int) and high < max(low, 1):
            return '"[]"'  # maxItems 0 (or less than minItems: no list follows it)
        if isinstance(high, int):
            rest = f'(", " {item})~{max(low - 1, 0)}..{high - 1}'
        else:
            rest = f'(", " {item})~{low - 1} (", " {item})*' if low > 1 else f'(", " {item})*'
        body = f"{item} {rest}"
        return self._rule(f'"[" {body} "]"' if low else f'"[" ({body})? "]"')

    def _object(self, schema: Mapping[str, Any], root: Mapping[str, Any]) -> str:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = [key for key in schema.get("required", ()) if isinstance(key, str)]
        if properties or required:
            members = []
            for key in [*properties, *(k for k in required if k not in properties)]:
                written = _lark(json.dumps(key, ensure_ascii=False) + ": ")
                value = self.value(properties.get(key, True), root)
                members.append((self._rule(f"{written} {value}"), key in required))
            return self._rule(f'"{{" {_sequence(members)} "}}"')
        extra = schema.get("additionalProperties", True)
        if extra is False:
            return '"{}"'
        pair = self._rule(f'/"(?:{_PY_CHAR})*"/ ": " {self.value(extra, root)}')
        return self._rule(f'"{{" ({pair} (", " {pair})*)? "}}"')

    def _ref(self, ref: str, root: Mapping[str, Any]) -> str:
        key = (id(root), ref)
        if key not in self._refs:
            target = _resolve(root, ref)
            if target is None:
                return self._any_value()
            index = len(self._lines)
            self._refs[key] = f"r{index}"
            self._lines.append("")  # reserved: the target may refer to itself
            self._lines[index] = f"r{index}: {self.value(target, root)}"
        return self._refs[key]


def _resolve(root: Mapping[str, Any], ref: str) -> Any:
    """The schema ``ref`` (``#`` or a JSON pointer from it) points to in ``root``."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
