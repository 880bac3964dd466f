"""Whether a chat template reads a message's content as a string or as a list of parts.

OpenAI's messages may carry ``content`` as a list of parts (``[{"type": "text", "text":
...}]``). Templates written for such lists loop over the content; most others (the default
model's among them) concatenate it as a string and fail on a list. As vLLM does, the
template's own source decides: a template that iterates over a message's content takes
parts as they are; for any other template, text-only parts are joined with newlines
before it renders, and a part of another kind is refused by name. This is the one place
that rule lives, for ``gen.chat()`` and ``ortgen serve`` alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from ..errors import InputError

ContentFormat = Literal["string", "openai"]

__all__ = ["ContentFormat", "detect_content_format", "join_text_parts"]


def detect_content_format(source: str) -> ContentFormat:
    """ "openai" when the template loops over a message's ``content`` (directly, or over
    a variable set from it); "string" otherwise, and for a template jinja cannot parse."""
    import jinja2
    from jinja2 import nodes

    try:
        tree = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except jinja2.TemplateSyntaxError:
        return "string"
    aliases = {
        target.name
        for assign in tree.find_all(nodes.Assign)
        if _reads_content(assign.node)
        for target in _names(assign.target)
    }
    for loop in tree.find_all(nodes.For):
        iterated = loop.iter
        if isinstance(iterated, nodes.Filter) and iterated.node is not None:
            iterated = iterated.node  # {% for part in message.content | list %}
        if _reads_content(iterated) or (
            isinstance(iterated, nodes.Name) and iterated.name in aliases
        ):
            return "openai"
    return "string"


def _reads_content(node: Any) -> bool:
    """``x['content']`` or ``x.content``."""
    from jinja2 import nodes

    if isinstance(node, nodes.Getattr):
        return node.attr == "content"
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
    return False


def _names(target: Any) -> Iterator[Any]:
    from jinja2 import nodes

    if isinstance(target, nodes.Name):
        yield target
    elif isinstance(target, nodes.Tuple):
        for item in target.items:
            yield from _names(item)


def join_text_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each list of content parts joined into one string (text parts,
    newline-separated); a part that is not text is an InputError naming it."""
    joined = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.get("type") != "text":
                    raise InputError(
                        f"messages[{i}].content[{j}] is a {part.get('type')!r} part; this "
                        "model's chat template takes text only (text parts are joined)",
                        field=f"messages[{i}].content[{j}]",
                    )
                texts.append(part["text"])
            message = {**message, "content": "\n".join(texts)}
        joined.append(message)
    return joined
