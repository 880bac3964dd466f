"""Chat templates compiled and rendered with jinja2 exactly the way transformers does.

transformers renders ``tokenizer.apply_chat_template`` in
``transformers.utils.chat_template_utils``; :class:`ChatTemplate` reproduces that
(environment, helpers, variables) so prompts match without importing transformers.
jinja2 is imported on first use, so loading a model that is never chatted with stays
light.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

from ..errors import InputError, ModelLoadError

__all__ = ["ChatTemplate"]


class ChatTemplate:
    """A chat template's jinja source, compiled on first use.

    ``owner`` names where the template comes from (the model folder), for error messages.
    """

    def __init__(self, source: str, *, owner: str) -> None:
        self.source = source
        self._owner = owner
        self._compiled: Any = None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool,
        special_tokens: Mapping[str, Any],
        extra: Mapping[str, Any],
    ) -> str:
        """The prompt, as transformers' ``apply_chat_template(..., tokenize=False)``.

        The template sees ``tools`` and ``documents`` (None unless given), the special
        tokens (``bos_token``, ``eos_token``, ...), the ``extra`` keyword arguments (which
        override them), ``messages`` and ``add_generation_prompt``.
        """
        template = self._compile()
        context: dict[str, Any] = {
            "tools": None,
            "documents": None,
            **special_tokens,
            **extra,
            "messages": _check_messages(messages),
            "add_generation_prompt": add_generation_prompt,
        }
        import jinja2

        try:
            return template.render(**context)
        except jinja2.TemplateError as exc:
            raise InputError(
                f"the chat template of {self._owner} rejected the messages: {exc}"
            ) from exc

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


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    shape = "a list of {'role': str, 'content': str} dicts"
    if not isinstance(messages, list | tuple):
        raise InputError(f"messages must be {shape}, got {type(messages).__name__}")
    if not messages:
        raise InputError(f"messages is empty; it must be {shape} with at least one message")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise InputError(
                f"messages[{i}] is a {type(msg).__name__}; each message must be a dict with "
                "'role' and 'content' strings"
            )
        for key in ("role", "content"):
            if key not in msg:
                raise InputError(
                    f"messages[{i}] has no {key!r}; each message needs 'role' and 'content' "
                    f"strings, got keys {sorted(map(str, msg))}"
                )
            if not isinstance(msg[key], str):
                raise InputError(
                    f"messages[{i}][{key!r}] is a {type(msg[key]).__name__}; it must be a str"
                )
        out.append(dict(msg))
    return out


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
        tags: ClassVar[set[str]] = {"generation"}

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
