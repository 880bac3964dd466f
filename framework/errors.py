"""Error types. Every error names what was wrong, where, and what would be right."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: one problem of a request: the setting or input it is about (an ortgen setting name
#: such as ``top_p``, or ``prompt``, ``messages[2]``, ``tools``; None when it is about
#: no one field), and the sentence that says what is wrong
Problem = tuple[str | None, str]


class OrtgenError(Exception):
    """Base class of every error ortgen raises on purpose."""


class ModelLoadError(OrtgenError):
    """A model folder or ONNX graph cannot be used for generation."""


class ExportError(OrtgenError):
    """Exporting a Hugging Face folder or GGUF file to ONNX failed."""


class ConfigError(OrtgenError, ValueError):
    """A generation setting is unknown, out of range or contradicts another.

    ``problems`` lists every problem as ``(field, message)``: a caller that answers for
    another vocabulary (the server names OpenAI's fields) maps ``field`` instead of
    reading the message, so rewording a message never moves the blame."""

    def __init__(self, message: str, *, problems: Sequence[Problem] = ()) -> None:
        super().__init__(message)
        self.problems: tuple[Problem, ...] = tuple(problems) or ((None, message),)

    @property
    def field(self) -> str | None:
        """The setting the first problem is about."""
        return self.problems[0][0]


class InputError(OrtgenError, ValueError):
    """A prompt or other request input cannot be generated from.

    ``field``: the input or setting at fault (``prompt``, ``messages[0].content[1]``,
    ``tool_choice``, ``max_new_tokens``, ...), or None; the server's ``param`` comes from
    it, never from the message."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class OutputError(InputError):
    """A job's output cannot be written: another job holds it, or the disk, a size limit
    or a read-only folder refused a write. What was written before stays, whole."""


class PluginError(OrtgenError):
    """A plugin registered a bad or duplicate component, or a name is unknown."""


class ComponentError(OrtgenError):
    """A component (processor, sampler, stopping criterion, cache) failed during a request.

    The message names the component and the decoding step; the request that hit it
    fails, other requests are unaffected.
    """

    #: what the request had produced when it failed (a ``GenerationOutput`` whose
    #: unfinished rows end with "error"), set by ``generate()``: nothing is lost
    partial: Any = None


class NoTokenLeft(ComponentError, InputError):
    """The request's own settings left no token to pick at a step (every id suppressed,
    or every id a constraint allows ruled out by another setting): a ComponentError to
    the loop, which fails only the rows it serves, and an InputError to the caller (the
    server answers 400), since the request asked for the contradiction.

    A component that raises it because every token it allows was already removed (a
    grammar after a cut) sets ``row`` (the row of the scores it was given) and
    ``allowed`` (the token ids it allows there): the loop then names the earlier
    processors that removed them, at no cost to the steps that do not fail."""

    row: int | None = None
    allowed: Sequence[int] | None = None
