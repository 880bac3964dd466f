"""A request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, checked and turned
into the :class:`~ortgen.protocols.chat_formats.ToolSpec` every chat format reads.

OpenAI's shapes: ``tools`` (``{"type": "function", "function": {"name", "description",
"parameters"}}``), ``tool_choice`` (``"none"``, ``"auto"``, ``"required"`` or
``{"type": "function", "function": {"name": ...}}``) and ``parallel_tool_calls``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InputError
from ..protocols.chat_formats import ToolSpec
from .kit import MAX_PARALLEL_CALLS, closed

__all__ = ["tool_spec"]


def tool_spec(
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = None,
) -> ToolSpec | None:
    """The calls an answer may make, or None when it may make none (no tools, or
    ``tool_choice`` ``"none"``).

    One call at most for a named ``tool_choice``, for a single tool with
    ``parallel_tool_calls`` unset, and for ``parallel_tool_calls=false``: a small model
    that has made its call tends to make it again until the token limit. Otherwise at
    most :data:`MAX_PARALLEL_CALLS`."""
    functions = _check_tools(tools) if tools is not None else {}
    choice = _check_choice(tool_choice, functions)
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise InputError(
            f"parallel_tool_calls must be true or false, got {parallel_tool_calls!r}",
            field="parallel_tool_calls",
        )
    if not functions or choice == "none":
        return None
    named = None if choice in ("auto", "required") else choice
    callable_ = {named: functions[named]} if named else functions
    one = (
        named is not None
        or parallel_tool_calls is False
        or (len(functions) == 1 and parallel_tool_calls is None)
    )
    return ToolSpec(
        tools=[dict(t) for t in tools or ()],
        functions={name: closed(schema) for name, schema in callable_.items()},
        calls_only=choice != "auto",
        max_calls=1 if one else MAX_PARALLEL_CALLS,
        named=named,
    )


def _check_tools(tools: Any) -> dict[str, dict[str, Any]]:
    """name -> parameters schema, each tool checked (OpenAI's shape)."""
    if isinstance(tools, str | bytes) or not isinstance(tools, Sequence):
        raise InputError(
            f"tools must be a list of tools, got {type(tools).__name__}", field="tools"
        )
    functions: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if (
            not isinstance(tool, Mapping)
            or tool.get("type") != "function"
            or not isinstance(function, Mapping)
        ):
            raise InputError(
                f'{where} must be {{"type": "function", "function": {{"name": ..., '
                f'"parameters": {{...}}}}}}, got {tool!r:.80}',
                field="tools",
            )
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", name):
            raise InputError(
                f"{where}.function.name must be 1-64 letters, digits, '_', '.', ':' or '-', "
                f"got {name!r}",
                field="tools",
            )
        if name in functions:
            raise InputError(f"{where}.function.name {name!r} is given twice", field="tools")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, Mapping):
            raise InputError(
                f"{where}.function.parameters must be a JSON Schema object", field="tools"
            )
        functions[name] = dict(parameters)
    return functions


def _check_choice(choice: Any, functions: Mapping[str, Any]) -> str:
    """``"none"``, ``"auto"``, ``"required"`` or a function's name."""
    if choice is None:
        return "auto" if functions else "none"
    if choice in ("none", "auto", "required"):
        if choice == "required" and not functions:
            raise InputError('tool_choice "required" needs tools', field="tool_choice")
        return str(choice)
    function = choice.get("function") if isinstance(choice, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(choice, Mapping) or choice.get("type") != "function" or not name:
        raise InputError(
            'tool_choice must be "none", "auto", "required" or {"type": "function", '
            f'"function": {{"name": ...}}}}, got {choice!r:.80}',
            field="tool_choice",
        )
    if name not in functions:
        raise InputError(
            f"tool_choice names {name!r}, which is not among the tools", field="tool_choice"
        )
    return str(name)
