"""The default model (SmolLM2-135M-Instruct) filling the 41 in-repo schemas.

A 135M model writes parseable JSON reliably only when the decoder is constrained: here
every answer that ends with the end of sequence must validate with ``jsonschema``
against its schema, greedy and sampled at temperature 0.7 (seeds 1-5 across the rows;
``benchmarks/structured.py`` and the server tests sample more). Each pass
is one batch with a row per schema (per-row settings: each row its own schema and seed),
so the grammar also runs with many different constraints side by side.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.schema_corpus import load_schemas

pytestmark = pytest.mark.default_model


def _rows(seed_of) -> list[dict]:
    return [
        {
            "messages": [{"role": "user", "content": entry["prompt"]}],
            "json_schema": entry["schema"],
            **({"seed": seed_of(i)} if seed_of else {}),
        }
        for i, (_, entry) in enumerate(load_schemas())
    ]


@pytest.mark.parametrize(
    ("name", "settings", "seed_of"),
    [
        ("greedy", {}, None),
        ("sampled", {"do_sample": True, "temperature": 0.7}, lambda i: 1 + i % 5),
    ],
)
def test_every_finished_answer_validates(default_gen, name, settings, seed_of) -> None:
    schemas = load_schemas()
    assert len(schemas) >= 30
    out = default_gen.generate(_rows(seed_of), max_new_tokens=160, **settings)
    finished = 0
    for (file, entry), text, reason, parsed in zip(
        schemas, out.text, out.finish_reasons, out.parsed, strict=True
    ):
        if reason != "eos":
            assert reason == "length", (file, reason)
            continue
        finished += 1
        jsonschema.validate(json.loads(text), entry["schema"])  # raises naming the problem
        assert parsed == json.loads(text), file
    print(f"{name}: {finished}/{len(schemas)} finished within 160 tokens")
    assert finished >= 0.8 * len(schemas), (name, out.finish_reasons)
