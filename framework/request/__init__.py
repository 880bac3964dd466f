"""One request builder for the library, the server and jobs.

A request, however it arrives (``gen.generate(...)``, ``gen.chat(...)``, an OpenAI body,
a job's input line), becomes the same things here: each row's settings (a row's own
constraint replacing the call's), the chat prompt (messages, tools, ``response_format``),
the rows grouped by settings into chains, the context rule, and the component checks.
Every error names the field at fault (``ConfigError.problems``, ``InputError.field``), so
a caller that speaks another vocabulary (the server's OpenAI fields) maps the field and
never reads the message.
"""

from .chat import ChatRequest, build_chat
from .checks import COMPONENT_KINDS, component_problems
from .context import clipped_length, max_length
from .rows import group_rows, row_settings, settings_key
from .start import start_generation, start_row

__all__ = [
    "COMPONENT_KINDS",
    "ChatRequest",
    "build_chat",
    "clipped_length",
    "component_problems",
    "group_rows",
    "max_length",
    "row_settings",
    "settings_key",
    "start_generation",
    "start_row",
]
