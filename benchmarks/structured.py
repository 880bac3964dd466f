"""Structured output on the default model: what the grammar costs per step, and decode
speed with a JSON Schema against the same request without one.

1. **Mask cost.** Every answer to the 41 in-repo schemas (``tests/data/schemas``, greedy,
   ``max_new_tokens`` 128), with the ``grammar`` processor's calls timed as the loop makes
   them: the mask on the step's path (``sparse``, and ``__call__`` when the mask allows
   many tokens: "mask (per step)"), and apart the grammar's other per-token work
   (``advance``: the matcher eats the token; ``forced_tokens``: what it forces next).
   The mask itself is computed beside the forward on another thread ("mask computed":
   llguidance's bitmask fill, also timed alone, and its unpacking), so on the step's path
   only waiting for it and applying it remain. Goal: mask p99 <= 1 ms.
2. **Decode speed.** For a few schemas (a key-heavy form, a person, corpus schemas) the
   same chat request (greedy) unconstrained, with the schema (fast-forward on: the
   tokens the grammar forces are taken without a forward of their own), and with the
   schema and ``fast_forward=False``, alternated in rounds in one process. Answers differ
   in length and content between the three, so the fair figure is decode tokens/s
   (generated tokens / decode seconds; forced tokens count as generated, since the user
   gets them) and the forwards per token. Goal: schema >= 0.95x unconstrained.

    python benchmarks/structured.py [--threads 1] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llguidance.numpy  # noqa: E402

import ortgen  # noqa: E402
from ortgen.plugins.grammar import GrammarConstraint  # noqa: E402
from tests.schema_corpus import load_schemas  # noqa: E402

KEY_HEAVY = {
    "type": "object",
    "properties": {
        key: {"type": "string", "maxLength": 12}
        for key in (
            "first_name", "last_name", "street", "city", "postal_code", "country",
            "phone", "email", "company", "job_title",
        )
    },
    "required": [
        "first_name", "last_name", "street", "city", "postal_code", "country",
        "phone", "email", "company", "job_title",
    ],
    "additionalProperties": False,
}  # fmt: skip
KEY_HEAVY_PROMPT = (
    "Fill the contact form as JSON for: Ana Lima, Rua Augusta 10, 1100-053 Lisbon, "
    "Portugal, +351 21 000 0000, ana@example.pt, works at Tejo Lda as an engineer."
)


class Timers:
    """Microseconds per call of each wrapped function, by name."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        samples = self.samples.setdefault(label, [])

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                samples.append(1e6 * (time.perf_counter() - start))

        setattr(owner, name, timed)

    def summary(self, label: str) -> dict[str, float]:
        values = sorted(self.samples.get(label, []))
        if not values:
            return {"count": 0}
        return {
            "count": len(values),
            "p50_us": round(values[len(values) // 2], 1),
            "p99_us": round(values[min(len(values) - 1, int(0.99 * len(values)))], 1),
            "max_us": round(values[-1], 1),
            "mean_us": round(statistics.fmean(values), 1),
        }


def mask_cost(gen: ortgen.TextGenerator) -> dict[str, Any]:
    """Time the grammar's calls over every corpus schema's answer (see module doc)."""
    timers = Timers()
    timers.wrap(GrammarConstraint, "sparse", "mask (sparse)")
    timers.wrap(GrammarConstraint, "__call__", "mask (dense)")
    timers.wrap(GrammarConstraint, "advance", "advance")
    timers.wrap(GrammarConstraint, "forced_tokens", "forced_tokens")
    timers.wrap(llguidance.numpy, "fill_next_token_bitmask", "llguidance fill")
    timers.wrap(GrammarConstraint, "_compute", "mask computed")
    finished = tokens = 0
    schemas = load_schemas()
    for _, entry in schemas:
        messages = [{"role": "user", "content": entry["prompt"]}]
        out = gen.chat(messages, json_schema=entry["schema"], max_new_tokens=128)
        finished += out.finish_reasons == ["eos"]
        tokens += len(out.tokens[0])
    # a step's mask is its sparse call, plus __call__ when sparse left it dense
    mask = timers.samples["mask (sparse)"] + timers.samples["mask (dense)"]
    timers.samples["mask (per step)"] = mask
    report = {label: timers.summary(label) for label in timers.samples}
    report["answers"] = {"schemas": len(schemas), "finished": finished, "tokens": tokens}
    return report


def decode_rounds(gen: ortgen.TextGenerator, rounds: int) -> dict[str, Any]:
    """Alternate unconstrained / schema / schema without fast-forward per schema."""
    corpus = dict(load_schemas())
    cases = {"key-heavy form": (KEY_HEAVY_PROMPT, KEY_HEAVY)}
    for name in ("01_person", "02_invoice", "14_ticket_triage"):
        if name in corpus:
            cases[name] = (corpus[name]["prompt"], corpus[name]["schema"])
    configs = {
        "unconstrained": {},
        "schema": {"json_schema": None},
        "schema, no fast-forward": {"json_schema": None, "fast_forward": False},
    }
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        case: {config: [] for config in configs} for case in cases
    }
    for prompt, schema in cases.values():  # warm up: llguidance's tokenizer, caches
        gen.chat([{"role": "user", "content": prompt}], json_schema=schema, max_new_tokens=8)
    for _ in range(rounds):
        for case, (prompt, schema) in cases.items():
            for config, settings in configs.items():
                own = {k: (schema if v is None else v) for k, v in settings.items()}
                out = gen.chat([{"role": "user", "content": prompt}], max_new_tokens=160, **own)
                stats = out.stats
                generated = len(out.tokens[0])
                decode_s = stats["total_s"] - stats["prefill_s"]
                forced = stats.get("fast_forward_tokens", 0.0)
                results[case][config].append(
                    {
                        "tokens": generated,
                        "decode_tok_s": (generated - 1) / decode_s if decode_s else 0.0,
                        "answer_ms": 1e3 * stats["total_s"],
                        "fast_forward": forced,
                        "forwards_saved": forced / generated if generated else 0.0,
                        "parsed": out.parsed is not None if "json_schema" in own else True,
                    }
                )
    return _decode_table(results)


def _decode_table(results: dict[str, dict[str, list[dict[str, float]]]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for case, configs in results.items():
        rows = {}
        for config, runs in configs.items():
            rows[config] = {
                key: round(statistics.median(r[key] for r in runs), 3)
                for key in ("tokens", "decode_tok_s", "answer_ms", "fast_forward", "forwards_saved")
            }
            rows[config]["parsed"] = all(r["parsed"] for r in runs)
        base = rows["unconstrained"]["decode_tok_s"]
        for config in rows:
            rows[config]["x_unconstrained"] = round(rows[config]["decode_tok_s"] / base, 3)
        table[case] = rows
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--skip-mask", action="store_true", help="only the decode rounds")
    args = parser.parse_args()
    gen = ortgen.load(threads=args.threads)
    report: dict[str, Any] = {"threads": args.threads, "rounds": args.rounds}
    if not args.skip_mask:
        report["mask"] = mask_cost(gen)
    report["decode"] = decode_rounds(gen, args.rounds)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    if "mask" in report:
        print("grammar processor, per call (us), 41 corpus schemas, greedy:")
        for label, row in report["mask"].items():
            print(f"  {label:18} {row}")
        p99 = report["mask"]["mask (per step)"].get("p99_us", 0)
        print(f"  goal: mask p99 <= 1000 us: {'met' if p99 <= 1000 else 'NOT met'} ({p99} us)")
    print("\ndecode tokens/s (median of rounds; answers differ, so compare tokens/s):")
    worst = float("inf")
    for case, rows in report["decode"].items():
        print(f"  {case}")
        for config, row in rows.items():
            print(f"    {config:24} {row}")
        worst = min(worst, rows["schema"]["x_unconstrained"])
    print(f"  goal: schema >= 0.95x unconstrained: {'met' if worst >= 0.95 else 'NOT met'}"
          f" (lowest {worst}x)")  # fmt: skip


if __name__ == "__main__":
    main()
