"""A Responses request's ``input`` items, ``tools`` and ``tool_choice`` as a chat's
messages, tools and tool choice (``responses_api`` puts them in a chat body).

Input items in, chat messages out:

- a message (``{"role", "content"}``, with or without ``"type": "message"``): ``user``,
  ``system``, ``developer`` or ``assistant``; content as text or parts
  (``input_text``, ``output_text``, ``refusal``) that become chat text parts, so the
  chat template layer joins or loops over them exactly as for a chat request;
- ``function_call`` items: tool calls of the assistant turn they follow (the output of
  one response, sent back, is one assistant turn: its message and calls together);
- ``function_call_output``: a ``tool`` message answering an earlier call by its
  ``call_id`` (a call_id no earlier call has is a mistake the template cannot show);
- ``reasoning``: its text becomes the ``reasoning_content`` of the next assistant turn
  (the template decides whether to render it), or is dropped when none follows.

Each message remembers the item it came from (``origins``), so an error the chat path
finds later in ``messages[3]`` names ``input[2]``. Text only: images, files and audio
are refused by name, never silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import RequestError

__all__ = ["conversation", "tool_choice", "tools"]

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")
_ITEMS = "message, function_call, function_call_output or reasoning"
_TOOL_KEYS = ("type", "name", "description", "parameters", "strict")
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def conversation(value: Any, instructions: str | None) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat messages ``instructions`` and ``input`` mean, and for each message the
    request field it came from (``instructions``, ``input``, ``input[2]``)."""
    reader = _Reader()
    if instructions is not None:
        reader.add({"role": "system", "content": instructions}, "instructions")
    if isinstance(value, str):
        reader.add({"role": "user", "content": value}, "input")
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            reader.read(i, item)
    else:
        raise RequestError("input must be text or a non-empty list of input items", param="input")
    return reader.messages, reader.origins


class _Reader:
    """Input items read in order into messages (see module doc)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.origins: list[str] = []
        self.calls: dict[str, str] = {}  # call_id -> function name, of the calls so far
        self.answered: set[str] = set()
        self.reasoning: list[str] = []  # thought text waiting for its assistant turn

    def add(self, message: dict[str, Any], origin: str) -> None:
        if message["role"] == "assistant" and self.reasoning:
            message["reasoning_content"] = "\n".join(self.reasoning)
        if message["role"] in ("assistant", "user", "tool"):
            self.reasoning = []  # a thought belongs to the turn right after it
        self.messages.append(message)
        self.origins.append(origin)

    def read(self, i: int, item: Any) -> None:
        at = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise RequestError(f"{at} must be an object (an input item)", param=at)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            self._message(at, item)
        elif kind == "function_call":
            self._call(at, item)
        elif kind == "function_call_output":
            self._output(at, item)
        elif kind == "reasoning":
            self._reasoning(at, item)
        elif kind == "item_reference":
            raise RequestError(
                f"{at} refers to a stored item; this server stores none: send the item itself",
                param=f"{at}.type",
            )
        elif kind is None:
            raise RequestError(
                f"{at} has no type (or role); it must be {_ITEMS}", param=f"{at}.type"
            )
        else:
            raise RequestError(
                f"{at} is a {kind!r:.40} item; this server takes {_ITEMS} items",
                param=f"{at}.type",
            )

    def _message(self, at: str, item: Mapping[str, Any]) -> None:
        role = item.get("role")
        if role not in _ROLES:
            raise RequestError(
                f"{at}.role must be one of {', '.join(_ROLES)}, got {role!r:.40}",
                param=f"{at}.role",
            )
        content = item.get("content")
        if isinstance(content, list):
            content = _parts(f"{at}.content", content)
        elif not isinstance(content, str):
            raise RequestError(
                f"{at}.content must be text or a list of content parts", param=f"{at}.content"
            )
        self.add({"role": role, "content": content}, at)

    def _call(self, at: str, item: Mapping[str, Any]) -> None:
        call_id = _text(item, "call_id", at)
        name = _text(item, "name", at)
        arguments = item.get("arguments")
        if not isinstance(arguments, str):
            raise RequestError(
                f"{at}.arguments must be a string (the call's JSON arguments)",
                param=f"{at}.arguments",
            )
        if call_id in self.calls:
            raise RequestError(
                f"{at}.call_id {call_id!r:.60} is used by an earlier call", param=f"{at}.call_id"
            )
        self.calls[call_id] = name
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant":  # the same turn
            last.setdefault("tool_calls", []).append(call)
        else:
            self.add({"role": "assistant", "content": None, "tool_calls": [call]}, at)

    def _output(self, at: str, item: Mapping[str, Any]) -> None:
        call_id = _text(item, "call_id", at)
        if call_id not in self.calls:
            raise RequestError(
                f"{at}.call_id {call_id!r:.60} answers no function_call before it",
                param=f"{at}.call_id",
            )
        if call_id in self.answered:
            raise RequestError(
                f"{at}.call_id {call_id!r:.60} is answered twice", param=f"{at}.call_id"
            )
        self.answered.add(call_id)
        output = item.get("output")
        if isinstance(output, list):
            output = _parts(f"{at}.output", output)
        elif not isinstance(output, str):
            raise RequestError(
                f"{at}.output must be text or a list of content parts", param=f"{at}.output"
            )
        message = {
            "role": "tool",
            "tool_call_id": call_id,
            "name": self.calls[call_id],
            "content": output,
        }
        self.add(message, at)

    def _reasoning(self, at: str, item: Mapping[str, Any]) -> None:
        """The thought's text: its ``content`` (reasoning_text), else its ``summary``;
        ``encrypted_content`` is OpenAI's and cannot be read here, so it is dropped."""
        texts: list[str] = []
        for key in ("content", "summary"):
            parts = item.get(key)
            if parts is None:
                continue
            if not isinstance(parts, list):
                raise RequestError(f"{at}.{key} must be a list", param=f"{at}.{key}")
            for j, part in enumerate(parts):
                text = part.get("text") if isinstance(part, Mapping) else None
                if not isinstance(text, str):
                    raise RequestError(
                        f'{at}.{key}[{j}] must be {{"type", "text"}}', param=f"{at}.{key}[{j}]"
                    )
                texts.append(text)
            if texts:
                break
        if texts:
            self.reasoning.append("\n".join(texts))


def _text(item: Mapping[str, Any], key: str, at: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise RequestError(f"{at}.{key} must be a non-empty string", param=f"{at}.{key}")
    return value


def _parts(at: str, parts: list[Any]) -> list[dict[str, Any]]:
    """Content parts as chat text parts; media parts are refused (text only)."""
    out = []
    for j, part in enumerate(parts):
        where = f"{at}[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _MEDIA_PARTS:
            raise RequestError(
                f"{where} is {kind}: this server reads text only", param=f"{where}.type"
            )
        if kind not in _TEXT_PARTS:
            raise RequestError(
                f"{where} must be a part of type input_text, output_text or refusal",
                param=f"{where}.type" if isinstance(part, Mapping) else where,
            )
        assert isinstance(part, Mapping)
        key = _TEXT_PARTS[kind]
        text = part.get(key)
        if not isinstance(text, str):
            raise RequestError(f"{where}.{key} must be a string", param=f"{where}.{key}")
        out.append({"type": "text", "text": text})
    return out


def tools(value: Any) -> list[dict[str, Any]] | None:
    """Responses' flat function tools (``{"type": "function", "name", "description",
    "parameters", "strict"}``) as chat tools. Calls always follow the parameters' schema,
    closed to the keys it lists (the chat formats' grammar), so ``strict`` is accepted
    either way."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise RequestError("tools must be a list of function tools", param="tools")
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, tool in enumerate(value):
        at = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise RequestError(f"{at} must be a function tool object", param=at)
        if tool.get("type") != "function":
            raise RequestError(
                f"{at} is a {tool.get('type')!r:.40} tool; this server runs only function "
                "tools (no built-in tools: web search, file search, code, MCP, ...)",
                param=f"{at}.type",
            )
        for key in tool:
            if key not in _TOOL_KEYS:
                raise RequestError(
                    f"{at}.{key} is not supported on a function tool", param=f"{at}.{key}"
                )
        name = tool.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
            raise RequestError(
                f"{at}.name must be 1-64 letters, digits, '_', '.', ':' or '-'", param=f"{at}.name"
            )
        if name in names:
            raise RequestError(f"{at}.name {name!r} is given twice", param=f"{at}.name")
        names.add(name)
        function: dict[str, Any] = {"name": name}
        for key, kinds in (("description", str), ("parameters", Mapping), ("strict", bool)):
            if tool.get(key) is None:
                continue
            if not isinstance(tool[key], kinds):
                raise RequestError(f"{at}.{key} has the wrong type", param=f"{at}.{key}")
            function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def tool_choice(value: Any) -> Any:
    """``"none"``, ``"auto"``, ``"required"`` or ``{"type": "function", "name"}`` as the
    chat ``tool_choice``; whether the named function is among the tools is the chat
    path's to check."""
    if value in ("none", "auto", "required"):
        return value
    if isinstance(value, Mapping) and value.get("type") == "function":
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError("tool_choice.name must name a function", param="tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    raise RequestError(
        'tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}'
        f" (no built-in or allowed_tools choices), got {value!r:.80}",
        param="tool_choice",
    )
