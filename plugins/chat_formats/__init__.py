"""The built-in chat formats (docs/chat-formats.md), registered as a third-party format
package registers its own. Each module is one family's format; ``FORMATS`` is the order
a model's template is matched against them (the most specific first): a template no
format recognises gets ``generic``."""

from __future__ import annotations

from ortgen import ChatFormatFactory, Register, hookimpl

from .generic import GenericFormat
from .hermes import HermesFormat
from .llama3 import Llama3JsonFormat
from .mistral import MistralFormat
from .phi4_mini import Phi4MiniFormat
from .pythonic import PythonicFormat

#: name -> format class, in the order templates are matched
FORMATS: dict[str, ChatFormatFactory] = {
    "mistral": MistralFormat,
    "phi4_mini": Phi4MiniFormat,
    "llama3_json": Llama3JsonFormat,
    "pythonic": PythonicFormat,
    "hermes": HermesFormat,
    "generic": GenericFormat,
}


@hookimpl
def register_chat_formats(register: Register[ChatFormatFactory]) -> None:
    for name, factory in FORMATS.items():
        register(name, factory)
