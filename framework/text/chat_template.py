"""Chat templates compiled and rendered with jinja2 exactly the way transformers does.

transformers renders ``tokenizer.apply_chat_template`` in
``transformers.utils.chat_template_utils``; :class:`ChatTemplate` reproduces that
(environment, helpers, variables, ``tools``/``documents`` handling and
``continue_final_message``) so prompts match without importing transformers. jinja2 is
imported on first use, so loading a model that is never chatted with stays light.

Messages are what transformers accepts: ``content`` as a string or a list of parts
(``{"type": "text", "text": ...}``, image and other parts passed to the template as they
are), assistant turns with ``tool_calls`` (OpenAI's ``{"type": "function", "function":
{...}}`` or the plain ``{"name": ..., "arguments": ...}``) whose content may be None or
absent, and ``tool`` results. transformers checks none of this and lets a bad message
crash somewhere inside the template; ortgen checks the shape first, so the error names
the message and the problem instead.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ..errors import InputError, ModelLoadError
from .content_format import ContentFormat, detect_content_format, join_text_parts

__all__ = ["ChatTemplate", "check_messages"]

# transformers marks the final message with this before rendering and cuts the prompt
# where it lands, for continue_final_message (render_jinja_template).
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "

# apply_chat_template's own arguments: transformers never passes them to the template, so
# they must not reach it here either. Their "off" values are what ortgen does anyway
# (text out, nothing padded); turning one on would silently do nothing, so it is an error.
_TOKENIZE_OPTIONS = (
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
)

# Exceptions a template raises when the messages are not what it expects (transformers
# lets them escape as they are): str + list, None + str, a missing key, an index, ...
_RENDER_ERRORS: tuple[type[Exception], ...] = (
    TypeError,
    ValueError,
    KeyError,
    IndexError,
    AttributeError,
    ArithmeticError,
)

_MESSAGE_SHAPE = (
    "a list of message dicts like {'role': 'user', 'content': 'text'} (content may also be "
    "a list of parts like {'type': 'text', 'text': '...'})"
)


class ChatTemplate:
    """A chat template's jinja source, compiled on first use.

    ``owner`` names where the template comes from (the model folder), for error messages.
    """

    def __init__(self, source: str, *, owner: str) -> None:
        self.source = source
        self._owner = owner
        self._compiled: Any = None

    @functools.cached_property
    def content_format(self) -> ContentFormat:
        """How the template reads a message's content (``content_format``), found on first
        use: parsing the template imports jinja2, which a model that is never asked to
        chat need not load (~6 MB and its import time at start)."""
        return detect_content_format(self.source)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool | None,
        special_tokens: Mapping[str, Any],
        extra: Mapping[str, Any],
    ) -> str:
        """The prompt, as transformers' ``apply_chat_template(..., tokenize=False)``.

        The template sees ``tools`` and ``documents`` (None unless given), the special
        tokens (``bos_token``, ``eos_token``, ...), the other ``extra`` keyword arguments
        (which override them), ``messages`` and ``add_generation_prompt``.

        ``extra`` may also hold transformers' ``continue_final_message``: the prompt then
        ends right after the final message's text, left open for the model to continue
        (a prefilled reply). It is taken out here, as transformers does not show it to the
        template. ``add_generation_prompt=None`` means "True unless continuing"; True
        together with ``continue_final_message`` is an error, as in transformers.
        """
        options = dict(extra)
        continue_final = bool(options.pop("continue_final_message", False))
        _drop_tokenize_options(options)
        if options.pop("chat_template", None) is not None:
            raise InputError(
                "chat_template= is not supported: ortgen renders the model's own chat "
                "template (a model with named templates picks 'tool_use' when tools are "
                "given, else 'default')",
                field="chat_template_kwargs",
            )
        if add_generation_prompt is None:
            add_generation_prompt = not continue_final
        if continue_final and add_generation_prompt:
            raise InputError(
                "continue_final_message and add_generation_prompt cannot both be set: "
                "continue_final_message leaves the final message open for the model to "
                "continue, add_generation_prompt starts a new assistant message; pass "
                "add_generation_prompt=False (it is on by default)",
                field="chat_template_kwargs",
            )
        checked = check_messages(messages)
        tools = _check_tools(options.pop("tools", None))
        documents = _check_documents(options.pop("documents", None))
        final_text = _mark_final_message(checked) if continue_final else None
        if self.content_format == "string":  # written for strings: text parts joined
            checked = join_text_parts(checked)

        template = self._compile()
        context: dict[str, Any] = {
            **special_tokens,
            **options,
            "tools": tools,
            "documents": documents,
            "messages": checked,
            "add_generation_prompt": add_generation_prompt,
        }
        import jinja2

        try:
            rendered: str = template.render(**context)
        except jinja2.TemplateError as exc:
            raise InputError(
                f"the chat template of {self._owner} rejected the messages: {exc}", field="messages"
            ) from exc
        except _RENDER_ERRORS as exc:
            raise InputError(
                f"the chat template of {self._owner} failed on these messages "
                f"({type(exc).__name__}: {exc}){_crash_hint(checked, tools)}",
                field="messages",
            ) from exc
        if final_text is not None:
            rendered = self._cut_after_final(rendered, final_text)
        return rendered

    def _cut_after_final(self, rendered: str, final_text: str) -> str:
        """Cut the prompt where the final message's text ends, as transformers does:
        right at the tag, or before trailing space the template trimmed with it."""
        tag = _CONTINUE_TAG.strip()
        if final_text.strip() not in rendered or tag not in rendered:
            raise InputError(
                f"continue_final_message is set but the chat template of {self._owner} does "
                "not render the final message's text as given (it drops or rewrites it), "
                "so the prompt cannot end inside that message",
                field="messages",
            )
        at = rendered.rindex(tag)
        if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
            return rendered[:at]
        return rendered[:at].rstrip()

    def _compile(self) -> Any:
        if self._compiled is None:
            import jinja2

            try:
                self._compiled = _compile_jinja_template(self.source)
            except jinja2.TemplateSyntaxError as exc:
                raise ModelLoadError(
                    f"the chat template of {self._owner} is not valid Jinja "
                    f"(line {exc.lineno}: {exc.message}); fix chat_template.jinja"
                ) from exc
        return self._compiled


def _drop_tokenize_options(options: dict[str, Any]) -> None:
    """Take transformers' tokenization arguments out of the template variables.

    Code written for transformers passes ``tokenize=False`` and friends; those are what
    ortgen does anyway, so they are accepted. One switched on would be silently ignored,
    so it is refused with what to use instead.
    """
    for name in _TOKENIZE_OPTIONS:
        if name not in options:
            continue
        value = options.pop(name)
        if value:
            raise InputError(
                f"{name}={value!r} is a transformers tokenization option; ortgen's "
                "apply_chat_template returns the prompt text (Tokenizer.encode_chat gives "
                "its token ids)",
                field="chat_template_kwargs",
            )


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """Shallow copies of ``messages`` after checking their shape (see the module doc).

    Checks only what every template relies on, so nothing a template could render is
    refused, except content that is missing on a message without tool calls: templates
    either crash on it or silently render nothing, and either way it is a mistake.
    """
    if not isinstance(messages, list | tuple):
        raise InputError(
            f"messages must be {_MESSAGE_SHAPE}, got {type(messages).__name__}", field="messages"
        )
    if not messages:
        raise InputError(
            f"messages is empty; it must be {_MESSAGE_SHAPE} with at least one", field="messages"
        )
    if isinstance(messages[0], list | tuple):
        raise InputError(
            "messages is a list of conversations; apply_chat_template renders one "
            "conversation (a list of message dicts) at a time",
            field="messages",
        )
    return [_check_message(i, msg) for i, msg in enumerate(messages)]


def _check_message(i: int, msg: Any) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(msg, Mapping):
        raise InputError(
            f"{where} is a {type(msg).__name__}; each message must be a dict with a 'role' "
            "string and 'content'",
            field=where,
        )
    if "role" not in msg:
        raise InputError(
            f"{where} has no 'role'; each message needs a 'role' string ('system', 'user', "
            f"'assistant', 'tool', ...), got keys {sorted(map(str, msg))}",
            field=where,
        )
    if not isinstance(msg["role"], str):
        raise InputError(
            f"{where}['role'] is a {type(msg['role']).__name__}; it must be a str", field=where
        )
    if not msg["role"].strip():
        raise InputError(
            f"{where}['role'] is empty; name who speaks ('user', 'assistant', ...)", field=where
        )
    has_calls = _check_tool_calls(where, msg.get("tool_calls"))
    content = msg.get("content")
    if content is None:
        if not has_calls:
            problem = " has no 'content'" if "content" not in msg else "['content'] is None"
            raise InputError(
                f"{where}{problem}; only an assistant message with 'tool_calls' may go "
                "without content (give a string, or a list of content parts)",
                field=where,
            )
    elif isinstance(content, list | tuple):
        _check_parts(where, content)
    elif isinstance(content, Mapping) and msg["role"] in ("tool", "ipython"):
        pass  # a tool result as a JSON object; templates such as Llama 3's render it
    elif not isinstance(content, str):
        raise InputError(
            f"{where}['content'] is a {type(content).__name__}; it must be a str or a list "
            "of content parts like {'type': 'text', 'text': '...'}",
            field=where,
        )
    return dict(msg)


def _check_parts(where: str, parts: Sequence[Any]) -> None:
    """Content parts: dicts with a 'type'; a text part's 'text' is a str. Other parts
    (image, audio, video, ...) go to the template as they are: it decides what they
    become, typically a placeholder token."""
    for j, part in enumerate(parts):
        at = f"{where}['content'][{j}]"
        if not isinstance(part, Mapping):
            raise InputError(
                f"{at} is a {type(part).__name__}; content parts must be dicts like "
                "{'type': 'text', 'text': '...'}",
                field=f"{where}.content[{j}]",
            )
        kind = part.get("type")
        if not isinstance(kind, str):
            # Templates pick parts by type, so an untyped part would be dropped unseen.
            raise InputError(
                f"{at} has no 'type' string (got keys {sorted(map(str, part))}); content "
                "parts look like {'type': 'text', 'text': '...'} or {'type': 'image', ...}",
                field=f"{where}.content[{j}]",
            )
        if kind == "text" and not isinstance(part.get("text"), str):
            got = type(part["text"]).__name__ if "text" in part else "nothing"
            raise InputError(
                f"{at} is a text part whose 'text' is {got}; it must be a str",
                field=f"{where}.content[{j}]",
            )


def _check_tool_calls(where: str, calls: Any) -> bool:
    """Whether the message carries tool calls, after checking each names its function,
    in OpenAI's ``{'type': 'function', 'function': {'name', 'arguments'}}`` shape or the
    plain ``{'name', 'arguments'}`` one. ``arguments`` (a dict or a JSON string) is left
    to the template: templates differ in how they print either."""
    if calls is None:
        return False
    if not isinstance(calls, list | tuple):
        raise InputError(
            f"{where}['tool_calls'] is a {type(calls).__name__}; it must be a list of "
            "{'type': 'function', 'function': {'name': ..., 'arguments': {...}}}",
            field=where,
        )
    for k, call in enumerate(calls):
        at = f"{where}['tool_calls'][{k}]"
        if not isinstance(call, Mapping):
            raise InputError(
                f"{at} is a {type(call).__name__}; a tool call is a dict like "
                "{'type': 'function', 'function': {'name': ..., 'arguments': {...}}}",
                field=where,
            )
        function = call.get("function", call)
        if "function" in call:
            at += "['function']"
            if not isinstance(function, Mapping):
                raise InputError(
                    f"{at} is a {type(function).__name__}; it must be a dict with 'name' "
                    "and 'arguments'",
                    field=where,
                )
        if not isinstance(function.get("name"), str):
            raise InputError(
                f"{at} has no 'name' string; a tool call names its function: "
                "{'type': 'function', 'function': {'name': ..., 'arguments': {...}}} or "
                "{'name': ..., 'arguments': {...}}",
                field=where,
            )
    return bool(calls)


def _check_tools(tools: Any) -> list[dict[str, Any]] | None:
    """``tools`` as transformers passes them: None, or a list of JSON-schema dicts.

    transformers also turns Python functions into schemas (``get_json_schema``, from type
    hints and the docstring); ortgen does not copy that parser, so a function is refused
    with how to get its schema.
    """
    if tools is None:
        return None
    if not isinstance(tools, list | tuple):
        raise InputError(
            f"tools must be a list of JSON-schema dicts like {{'type': 'function', "
            f"'function': {{'name': ..., 'description': ..., 'parameters': {{...}}}}}}, got "
            f"{type(tools).__name__}",
            field="tools",
        )
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if isinstance(tool, Mapping):
            out.append(dict(tool))
        elif callable(tool):
            name = getattr(tool, "__name__", type(tool).__name__)
            raise InputError(
                f"tools[{i}] is the function {name}; ortgen takes tools as JSON-schema dicts "
                "({'type': 'function', 'function': {'name': ..., 'description': ..., "
                "'parameters': {...}}}); transformers.utils.get_json_schema(func) makes one",
                field="tools",
            )
        else:
            raise InputError(
                f"tools[{i}] is a {type(tool).__name__}; each tool must be a JSON-schema dict",
                field="tools",
            )
    return out


def _check_documents(documents: Any) -> Any:
    """``documents`` (for retrieval-augmented templates): None or a list of dicts,
    usually with 'title' and 'text', as transformers requires."""
    if documents is None:
        return None
    if not isinstance(documents, list | tuple):
        raise InputError(
            "documents must be a list of dicts like {'title': ..., 'text': ...}, got "
            f"{type(documents).__name__}",
            field="chat_template_kwargs",
        )
    for i, doc in enumerate(documents):
        if not isinstance(doc, Mapping):
            raise InputError(
                f"documents[{i}] is a {type(doc).__name__}; each document must be a dict "
                "like {'title': ..., 'text': ...}",
                field="chat_template_kwargs",
            )
    return documents


def _mark_final_message(messages: list[dict[str, Any]]) -> str:
    """Append transformers' continue tag to the final message's text (its last text part
    when content is a list), in place on the copies; returns the text before the tag."""
    final = messages[-1]
    where = f"messages[{len(messages) - 1}]"
    content = final.get("content")
    if isinstance(content, str):
        final["content"] = content + _CONTINUE_TAG
        return content
    if isinstance(content, list | tuple):
        parts = [dict(part) for part in content]
        for part in reversed(parts):
            if "text" in part:  # transformers takes the last part with a 'text' key
                text = part["text"]
                if not isinstance(text, str):
                    break
                part["text"] = text + _CONTINUE_TAG
                final["content"] = parts
                return text
    raise InputError(
        f"continue_final_message is set but the final message ({where}) has no text to "
        "continue; give it string content or a text part",
        field=where,
    )


def _crash_hint(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """What in the messages the template most likely did not expect, when it crashed:
    templates written for plain strings fail on content parts or missing content."""
    for i, msg in enumerate(messages):
        content = msg.get("content")
        if isinstance(content, list | tuple):
            return (
                f"; messages[{i}] has content as a list of parts, which this template may "
                "not support: pass the text as a string"
            )
        if content is None:
            return (
                f"; messages[{i}] has no content (tool calls only), which this template "
                "may not support"
            )
        if isinstance(content, Mapping):
            return f"; messages[{i}] has a dict as content, which this template may not support"
    if tools:
        return "; check that tools have the shape this template expects"
    return ""


def _compile_jinja_template(source: str) -> Any:
    """Compile like transformers' ``_compile_jinja_template``: an immutable sandbox with
    trim_blocks, lstrip_blocks, loop controls, the ``{% generation %}`` tag, and the
    ``raise_exception``, ``strftime_now`` and ``tojson`` helpers."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        # transformers' AssistantTracker; only the assistant mask (unused here) differs.
        tags = {"generation"}  # noqa: RUF012 (jinja2 declares it an instance variable)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_generation_support")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _generation_support(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)
