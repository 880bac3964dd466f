"""Generation config: Hugging Face ``generation_config.json`` field names, resolved in
layers, and pipeline files.

Layers, later wins: library defaults < model ``config.json`` < model
``generation_config.json`` < pipeline file < call arguments. Each resolved value
remembers which layer set it, so ``ortgen config show`` can say why a value is what it is.

- ``fields``: ``GenerationConfig`` (a leaf: every setting, its type and default);
- ``values``: coercing one value to its field's type, and validating a config;
- ``layers``: the model's layers and ``resolve``;
- ``pipeline``: pipeline files (``[generation]``, ``[output]``, ``[run]``, components).
"""

from .fields import (
    COMPONENT_KINDS,
    COMPONENT_LISTS,
    DEFAULTS,
    FIELDS,
    IGNORED_HF_FIELDS,
    SAMPLING_ONLY,
    UNSUPPORTED_HF_FIELDS,
    GenerationConfig,
)
from .layers import LAYERS, Resolved, model_layers, resolve

__all__ = [
    "COMPONENT_KINDS",
    "COMPONENT_LISTS",
    "DEFAULTS",
    "FIELDS",
    "IGNORED_HF_FIELDS",
    "LAYERS",
    "SAMPLING_ONLY",
    "UNSUPPORTED_HF_FIELDS",
    "GenerationConfig",
    "Resolved",
    "model_layers",
    "resolve",
]
