"""Values for the fuzz tests: every generation setting with values of its own type (in
range or not) and of any other, and JSON/TOML values of any shape.

Not a test module (``tests/test_fuzz_inputs.py``, ``tests/test_fuzz_server.py``).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ortgen.config import FIELDS, IGNORED_HF_FIELDS, UNSUPPORTED_HF_FIELDS
from ortgen.config.values import BOOL_FIELDS, FLOAT_FIELDS, INT_FIELDS, TOKEN_LIST_FIELDS
from ortgen.plugin_host.manager import build_registry, make_plugin_manager
from ortgen.request import COMPONENT_KINDS

REGISTRY = build_registry(make_plugin_manager())
SETTING_KEYS = sorted({*FIELDS, *IGNORED_HF_FIELDS, *UNSUPPORTED_HF_FIELDS})

INT64 = st.integers(-(2**63), 2**63 - 1)
SMALL_INT = st.integers(-3, 300)
FLOAT = st.one_of(
    st.floats(-5, 5), st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0])
)
TEXT = st.text(max_size=12)
#: printable ASCII: what the tiny models' character vocabulary holds
SPELLABLE = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12)
SCALAR = st.one_of(st.booleans(), SMALL_INT, INT64, FLOAT, TEXT)
KEY = st.one_of(st.text(min_size=1, max_size=10), st.sampled_from(SETTING_KEYS))
#: any TOML value (no null: TOML has none)
TOML_VALUE = st.recursive(
    SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEY, inner, max_size=4)),
    max_leaves=12,
)
#: any JSON value
JSON_VALUE = st.recursive(
    st.one_of(st.none(), SCALAR),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def typed_value(key: str) -> st.SearchStrategy[Any]:
    """A value of the setting's own type (mostly small: in range for most settings, so
    requests get past the checks; or any), or of any other type."""
    if key in INT_FIELDS:
        own: st.SearchStrategy[Any] = st.one_of(
            st.integers(1, 8), st.integers(1, 8), SMALL_INT, INT64
        )
    elif key in FLOAT_FIELDS:
        own = st.one_of(st.floats(0.05, 1), st.floats(0.05, 1), FLOAT)
    elif key == "sequence_bias":
        pair = st.tuples(st.lists(SMALL_INT, min_size=1, max_size=3), FLOAT).map(list)
        own = st.lists(pair, max_size=3) | st.lists(st.lists(SMALL_INT, max_size=3), max_size=3)
    elif key == "exponential_decay_length_penalty":
        own = st.tuples(SMALL_INT, FLOAT).map(list)
    elif key in BOOL_FIELDS:
        own = st.booleans()
    elif key in TOKEN_LIST_FIELDS or key in ("eos_token_id", "forced_eos_token_id"):
        own = st.lists(SMALL_INT, max_size=4)
    elif key == "bad_words_ids":
        own = st.lists(st.lists(SMALL_INT, max_size=3), max_size=3)
    elif key in ("stop_strings", "dry_sequence_breakers"):
        own = st.lists(TEXT, max_size=3)
    elif key == "choice":  # text the tiny models' vocabulary can spell (see the xfail in
        own = st.lists(SPELLABLE, max_size=3)  # tests/test_fuzz_server.py)
    elif key == "logit_bias":
        own = st.dictionaries(st.integers(0, 300).map(str), FLOAT, max_size=3)
    elif key in ("cache", "sampler", "drafter"):
        own = st.one_of(st.sampled_from(REGISTRY.names(COMPONENT_KINDS[key])), TEXT)
    elif key == "json_schema":
        own = st.sampled_from(
            [{"type": "object"}, {"type": "integer"}, '{"type": "string"}', "{", {"type": 3}]
        ) | st.text(min_size=1, max_size=300)  # a file's name, too long for the system too
    elif key in ("regex", "grammar"):
        own = st.sampled_from(["[a-z]+", "(", 'start: "a"', "start:", ""])
    else:
        own = TOML_VALUE
    return st.one_of(own, own, TOML_VALUE)
