"""Test data for structured output: hand-written schemas and the JSON Schema Test Suite.

`tests/data/schemas/*.json` each hold {"prompt", "schema", "example"}: a user instruction, a
small JSON Schema a 135M chat model can fill, and one instance that satisfies it.
`tests/data/json-schema-test-suite/draft2020-12/*.json` are the official draft 2020-12 tests
(see the README there for their origin and licence).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
SCHEMA_DIR = DATA_DIR / "schemas"
SUITE_DIR = DATA_DIR / "json-schema-test-suite" / "draft2020-12"


def load_schemas() -> list[tuple[str, dict]]:
    """(file stem, parsed file object) for every hand-written schema file, sorted by name."""
    return [
        (path.stem, json.loads(path.read_text(encoding="utf-8")))
        for path in sorted(SCHEMA_DIR.glob("*.json"))
    ]


def suite_cases() -> Iterator[tuple[str, str, dict | bool, str, object, bool]]:
    """Every test of the vendored suite, in file order.

    Yields (file name, group description, group schema, test description, instance, valid).
    A group's schema is a dict, except in boolean_schema.json where it is ``True``/``False``.
    """
    for path in sorted(SUITE_DIR.glob("*.json")):
        for group in json.loads(path.read_text(encoding="utf-8")):
            for test in group["tests"]:
                yield (
                    path.name,
                    group["description"],
                    group["schema"],
                    test["description"],
                    test["data"],
                    test["valid"],
                )
