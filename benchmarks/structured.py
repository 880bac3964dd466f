"""Structured output on the default model: what the ``grammar`` processor costs per step,
and how fast a request decodes with a JSON Schema against the same request without one.

1. **Mask cost.** Every corpus schema (``tests/data/schemas``, 41) answered greedy with
   ``max_new_tokens`` 128 (fast-forward on, the default), with the ``grammar``
   processor's calls timed as the loop makes them (its methods are wrapped in this
   script only). Three groups:

   - *On the step's path.* The mask per step: the ``sparse`` call plus, when ``sparse``
     left the row dense (many tokens allowed: free text in a string), the ``__call__``
     that follows on the same scores. It splits into waiting for the mask
     (``_mask_for``: ``prepare()`` starts the mask beside the forward, so this is what
     is left of llguidance's work after it) and applying it (``Candidates`` or a dense
     masked copy). Then the grammar's other calls there: ``advance`` (the matcher eats
     the token), ``forced_tokens`` (what it forces next), ``prepare`` (handing the next
     mask to the worker thread), and all of them summed per step.
   - *Beside the forward.* The mask computation (``_compute``: llguidance's fill and the
     unpacking) on the worker thread, and llguidance's fill within it.
   - *Outside the loop.* llguidance's fill alone: the same answers replayed through a
     fresh matcher, one fill per position (warm caches, no forward beside it), and
     ortgen's unpacking of the bits (unpack, flat indices) alone.

   Goal: mask per step p99 <= 1 ms.
2. **Decode speed.** For a few schemas (a key-heavy form of 10 short fields, a person,
   corpus schemas) the same chat request, greedy, ``max_new_tokens`` 160:
   (a) unconstrained, (b) with the schema (fast-forward on: tokens the grammar forces
   are taken without a forward of their own), (c) with the schema and
   ``fast_forward=False`` (every token sampled under the mask). After a warm-up
   request of each (the first builds llguidance's tokenizer), a, b, c alternate in
   rounds in one process. Answers differ in length and content, so the fair figure is
   decode tokens/s: tokens after the first / (total_s - prefill_s), i.e.
   ``1000 / stats["decode_ms_per_token"]`` (the first token comes from the prefill's
   logits; forced tokens count, since the user gets them). Per configuration: median
   and range of tokens/s over rounds, the ratios (b)/(a) and (c)/(a) paired within
   each round, ms per answer (from the call, grammar compile included), decode ms per
   forward (decode seconds / forwards after the prefill), tokens per answer, forced
   tokens per answer and forwards saved (forced / tokens). Goal: (b) >= 0.95x (a) for
   every schema.

Figures are printed as tables (``--json``: one JSON object instead) and written to
``benchmarks/results/structured.json``. Timings are never asserted; on a noisy machine
read the ratios.

    python benchmarks/structured.py [--threads 1] [--rounds 5] [--json]
        [--schemas key_heavy person 02_invoice ...] [--skip-mask] [--skip-decode]

``--schemas`` restricts both parts to the named schemas (``key_heavy``, ``person`` or a
corpus file stem; a unique prefix such as ``02`` will do).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llguidance
import llguidance.numpy
import numpy as np

import ortgen
from ortgen.loop.generate import Generation
from ortgen.plugins.grammar import GrammarConstraint

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.schema_corpus import load_schemas  # noqa: E402

MASK_GOAL_US = 1000.0
SPEED_GOAL = 0.95
MASK_NEW_TOKENS = 128
DECODE_NEW_TOKENS = 160

_FIELDS = ("first_name", "last_name", "street", "city", "postal_code", "country", "phone",
           "email", "company", "job_title")  # fmt: skip
KEY_HEAVY = {
    "type": "object",
    "properties": {key: {"type": "string", "maxLength": 12} for key in _FIELDS},
    "required": list(_FIELDS),
    "additionalProperties": False,
}
KEY_HEAVY_PROMPT = (
    "Fill the contact form as JSON for: Ana Lima, Rua Augusta 10, 1100-053 Lisbon, "
    "Portugal, +351 21 000 0000, ana@example.pt, works at Tejo Lda as an engineer."
)
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PERSON_PROMPT = "Extract as JSON: 'Maria, 34, lives in Lisbon.'"
OWN = {"key_heavy": (KEY_HEAVY_PROMPT, KEY_HEAVY), "person": (PERSON_PROMPT, PERSON)}
DECODE_DEFAULT = ("key_heavy", "person", "02_invoice", "14_ticket_triage", "29_log_entry")

#: the three configurations of the decode part, alternated in this order
CONFIGS: dict[str, dict[str, Any]] = {
    "unconstrained": {},
    "schema": {"fast_forward": True},
    "schema, no fast-forward": {"fast_forward": False},
}

Case = tuple[str, dict[str, Any]]  # (prompt, schema)


# -- schemas and requests --------------------------------------------------------------------------


def all_cases() -> dict[str, Case]:
    """The script's own schemas, then every corpus schema by file stem."""
    cases = dict(OWN)
    cases.update((stem, (entry["prompt"], entry["schema"])) for stem, entry in load_schemas())
    return cases


def pick_cases(names: list[str], cases: dict[str, Case]) -> dict[str, Case]:
    """The named cases (exact name or unique prefix), in the order given."""
    picked = {}
    for name in names:
        matches = [key for key in cases if key == name] or [k for k in cases if k.startswith(name)]
        if len(matches) != 1:
            found = ", ".join(matches) if matches else "none"
            raise SystemExit(f"--schemas {name!r}: matches {found}; known: {', '.join(cases)}")
        picked[matches[0]] = cases[matches[0]]
    return picked


def chat(gen: ortgen.TextGenerator, prompt: str, settings: dict[str, Any], new: int) -> Any:
    """One greedy chat answer."""
    messages = [{"role": "user", "content": prompt}]
    return gen.chat(messages, max_new_tokens=new, do_sample=False, **settings)


# -- statistics -----------------------------------------------------------------------


def distribution(values: list[float]) -> dict[str, float]:
    """count, p50, p99, max and mean of microsecond samples."""
    if not values:
        return {"count": 0}
    data = np.asarray(values)
    return {
        "count": int(data.size),
        "p50_us": round(float(np.percentile(data, 50)), 1),
        "p99_us": round(float(np.percentile(data, 99)), 1),
        "max_us": round(float(data.max()), 1),
        "mean_us": round(float(data.mean()), 1),
    }


def spread(values: list[float], digits: int = 3) -> dict[str, float]:
    """Median, min and max of per-round figures."""
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


# -- part 1: the processor's cost per step --------------------------------------------


#: the grammar's calls on the step's path besides the mask: the matcher eats the token,
#: says what it forces next, and starts the next mask on the worker thread
OTHER_CALLS = ("advance", "forced_tokens", "prepare")


@dataclass
class Probe:
    """Timings of the grammar processor's calls, taken by wrapping its methods."""

    steps: list[float] = field(default_factory=list)  # the mask's cost per step
    kinds: list[str] = field(default_factory=list)  # "candidates" or "dense", per step
    waits: list[float] = field(default_factory=list)  # of which waiting for the mask
    calls: dict[str, list[float]] = field(default_factory=dict)  # other calls by name
    per_step: dict[int, float] = field(default_factory=dict)  # every call on the path, by step
    grammars: list[tuple[Any, str, int]] = field(default_factory=list)  # tokenizer, grammar, V
    waits_known: bool = True  # False when the processor has no ``_mask_for`` to time
    step: int = 0  # the loop's steps so far (``Generation._step`` calls)
    _wait: float = 0.0  # ``_mask_for`` time inside the current sparse/__call__
    _dense_pending: tuple[int, float, float] | None = None  # sparse said None: (id, us, wait)

    def record_sparse(self, scores: Any, us: float, result: Any) -> None:
        self.on_path(us)
        if result is None:  # the dense __call__ follows on the same scores
            self._dense_pending = (id(scores), us, self._wait)
        else:
            self._add_step(us, self._wait, "candidates")

    def record_dense(self, scores: Any, us: float) -> None:
        self.on_path(us)
        pending, self._dense_pending = self._dense_pending, None
        if pending is not None and pending[0] == id(scores):
            self._add_step(pending[1] + us, pending[2] + self._wait, "dense")
        else:
            self._add_step(us, self._wait, "dense")

    def record_call(self, name: str, us: float) -> None:
        self.calls.setdefault(name, []).append(us)
        if name in OTHER_CALLS:
            self.on_path(us)

    def on_path(self, us: float) -> None:
        self.per_step[self.step] = self.per_step.get(self.step, 0.0) + us

    def _add_step(self, us: float, wait: float, kind: str) -> None:
        self.steps.append(us)
        self.waits.append(wait)
        self.kinds.append(kind)


def _timed(original: Callable[..., Any], after: Callable[[tuple, float, Any], None]) -> Any:
    """``original`` wrapped: ``after(args, microseconds, result)`` once it returns
    (with its signature: the registry reads the factory's parameters)."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = original(*args, **kwargs)
        after(args, 1e6 * (time.perf_counter() - start), result)
        return result

    return wrapper


def _before(original: Callable[..., Any], first: Callable[[], None]) -> Any:
    """``original`` wrapped: ``first()`` before each call."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        first()
        return original(*args, **kwargs)

    return wrapper


def _wrappers(probe: Probe, saved: dict[str, Any]) -> dict[str, Any]:
    """GrammarConstraint's methods timed into ``probe`` (those it has)."""

    def reset_wait() -> None:
        probe._wait = 0.0

    def add_wait(args: tuple, us: float, result: Any) -> None:
        probe._wait += us

    def after_init(args: tuple, us: float, result: Any) -> None:
        constraint = args[0]
        probe.step += 1  # a new request: its first prepare() comes before its first step
        probe.grammars.append((constraint.tokenizer, constraint.grammar, constraint.vocab))

    def record(name: str) -> Callable[[tuple, float, Any], None]:
        return lambda args, us, result: probe.record_call(name, us)

    wrappers = {
        "__init__": _timed(saved["__init__"], after_init),
        "sparse": _before(
            _timed(saved["sparse"], lambda a, us, r: probe.record_sparse(a[2], us, r)), reset_wait
        ),
        "__call__": _before(
            _timed(saved["__call__"], lambda a, us, r: probe.record_dense(a[2], us)), reset_wait
        ),
    }
    if "_mask_for" in saved:
        wrappers["_mask_for"] = _timed(saved["_mask_for"], add_wait)
    for name in ("_compute", *OTHER_CALLS):
        if name in saved:
            wrappers[name] = _timed(saved[name], record(name))
    return wrappers


@contextmanager
def probing() -> Iterator[Probe]:
    """Wrap GrammarConstraint's methods, llguidance's fill and the loop's step (to tell
    the steps apart); restore them after."""
    probe = Probe()
    cls = GrammarConstraint
    names = ("__init__", "sparse", "__call__", "_mask_for", "_compute", *OTHER_CALLS)
    saved = {name: cls.__dict__[name] for name in names if name in cls.__dict__}
    probe.waits_known = "_mask_for" in saved
    fill = llguidance.numpy.fill_next_token_bitmask
    step = Generation._step

    def next_step() -> None:
        probe.step += 1

    try:
        for name, wrapper in _wrappers(probe, saved).items():
            setattr(cls, name, wrapper)
        fill_timed = _timed(fill, lambda a, us, r: probe.record_call("fill (in the loop)", us))
        llguidance.numpy.fill_next_token_bitmask = fill_timed
        Generation._step = _before(step, next_step)
        yield probe
    finally:
        for name, original in saved.items():
            setattr(cls, name, original)
        llguidance.numpy.fill_next_token_bitmask = fill
        Generation._step = step


@dataclass
class Answer:
    """One constrained answer of the mask pass."""

    name: str
    tokens: list[int]
    finish: str
    parsed: bool


def answer_corpus(gen: ortgen.TextGenerator, cases: dict[str, Case]) -> tuple[Probe, list[Answer]]:
    """Answer every case once under the probe (after an unprobed warm-up request)."""
    prompt, schema = next(iter(cases.values()))
    chat(gen, prompt, {"json_schema": schema}, 8)  # llguidance's tokenizer, first calls
    answers = []
    with probing() as probe:
        for name, (prompt, schema) in cases.items():
            out = chat(gen, prompt, {"json_schema": schema}, MASK_NEW_TOKENS)
            reason = out.finish_reasons[0]
            answers.append(Answer(name, list(out.tokens[0]), reason, out.parsed is not None))
            log(f"  mask pass: {name:28s} {len(out.tokens[0]):4d} tokens, {reason}")
    return probe, answers


def fill_alone(grammars: list[tuple[Any, str, int]], answers: list[Answer]) -> dict[str, Any]:
    """llguidance's fill and ortgen's unpacking, replayed outside the loop: a fresh
    matcher per answer, one fill per position, then the answer's token."""
    fills: list[float] = []
    unpacks: list[float] = []
    for (tokenizer, grammar, vocab), answer in zip(grammars, answers, strict=True):
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        bits = np.zeros((1, (vocab + 31) // 32), dtype=np.int32)
        for token in answer.tokens:
            if matcher.is_stopped():
                break  # the end of sequence the finished grammar asked for
            start = time.perf_counter()
            llguidance.numpy.fill_next_token_bitmask(matcher, bits, 0)
            middle = time.perf_counter()
            allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little").view(bool)
            np.flatnonzero(allowed)
            end = time.perf_counter()
            fills.append(1e6 * (middle - start))
            unpacks.append(1e6 * (end - middle))
            if not matcher.consume_token(token):
                raise RuntimeError(f"{answer.name}: replay refused token {token}")
    return {
        "llguidance fill alone": distribution(fills),
        "unpack + indices alone": distribution(unpacks),
    }


def mask_cost(gen: ortgen.TextGenerator, cases: dict[str, Case]) -> dict[str, Any]:
    """Part 1 (see module doc)."""
    probe, answers = answer_corpus(gen, cases)
    candidates = [us for us, kind in zip(probe.steps, probe.kinds, strict=True) if kind != "dense"]
    dense = [us for us, kind in zip(probe.steps, probe.kinds, strict=True) if kind == "dense"]
    applying = [us - wait for us, wait in zip(probe.steps, probe.waits, strict=True)]
    on_path = {
        "mask per step (sparse + __call__)": distribution(probe.steps),
        "- few allowed (Candidates)": distribution(candidates),
        "- many allowed (dense copy)": distribution(dense),
        "- waiting for the mask": distribution(probe.waits if probe.waits_known else []),
        "- applying it": distribution(applying if probe.waits_known else []),
        **{name: distribution(probe.calls.get(name, [])) for name in OTHER_CALLS},
        "all grammar calls per step": distribution(list(probe.per_step.values())),
    }
    beside = {
        "mask computed (_compute)": distribution(probe.calls.get("_compute", [])),
        "- llguidance fill": distribution(probe.calls.get("fill (in the loop)", [])),
    }
    rows = {
        "on the step's path": on_path,
        "beside the forward (worker thread)": beside,
        "outside the loop (answers replayed)": fill_alone(probe.grammars, answers),
    }
    eos = [a for a in answers if a.finish == "eos"]
    p99 = on_path["mask per step (sparse + __call__)"].get("p99_us", 0.0)
    return {
        "timings_us": rows,
        "answers": {
            "schemas": len(answers),
            "tokens": sum(len(a.tokens) for a in answers),
            "finished_eos": len(eos),
            "eos_parsed": sum(a.parsed for a in eos),
            "unfinished": [a.name for a in answers if a.finish != "eos"],
        },
        "goal": {"p99_us_at_most": MASK_GOAL_US, "p99_us": p99, "met": p99 <= MASK_GOAL_US},
    }


# -- part 2: decode speed with a schema vs unconstrained --------------------------------


def settings_for(config: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The call's settings for a configuration of CONFIGS."""
    return {"json_schema": schema, **CONFIGS[config]} if CONFIGS[config] else {}


def measure(gen: ortgen.TextGenerator, prompt: str, settings: dict[str, Any]) -> dict[str, Any]:
    """One answer's figures."""
    out = chat(gen, prompt, settings, DECODE_NEW_TOKENS)
    stats = out.stats
    tokens = len(out.tokens[0])
    forced = int(stats.get("fast_forward_tokens", 0))
    decode_s = stats["total_s"] - stats["prefill_s"]
    forwards = tokens - 1 - forced  # decode forwards (the prefill made the first token)
    return {
        "tokens": tokens,
        "decode_tok_s": 1e3 / stats["decode_ms_per_token"] if tokens > 1 else float("nan"),
        "ms_per_forward": 1e3 * decode_s / forwards if forwards > 0 else float("nan"),
        "answer_ms": 1e3 * stats["total_s"],
        "forced": forced,
        "finish": out.finish_reasons[0],
        "parsed": out.parsed is not None,
    }


def decode_rounds(
    gen: ortgen.TextGenerator, cases: dict[str, Case], rounds: int
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every case in every configuration, a, b, c alternated, ``rounds`` times."""
    for prompt, schema in cases.values():  # warm-up, not kept
        for config in CONFIGS:
            chat(gen, prompt, settings_for(config, schema), 16)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {config: [] for config in CONFIGS} for name in cases
    }
    for number in range(rounds):
        for name, (prompt, schema) in cases.items():
            for config in CONFIGS:
                runs[name][config].append(measure(gen, prompt, settings_for(config, schema)))
        log(f"  decode round {number + 1}/{rounds} done")
    return runs


def summarize_case(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians and spreads per configuration, and the ratios to unconstrained paired
    within each round."""
    base = [run["decode_tok_s"] for run in runs["unconstrained"]]
    table = {}
    for config, own in runs.items():
        tok_s = [run["decode_tok_s"] for run in own]
        tokens = statistics.median(run["tokens"] for run in own)
        forced = statistics.median(run["forced"] for run in own)
        table[config] = {
            "decode_tok_s": spread(tok_s, 1),
            "x_unconstrained": spread([b / a for a, b in zip(base, tok_s, strict=True)]),
            "ms_per_forward": round(statistics.median(run["ms_per_forward"] for run in own), 2),
            "answer_ms": spread([run["answer_ms"] for run in own], 1),
            "tokens": tokens,
            "forced": forced,
            "forwards_saved_pct": round(100 * forced / tokens, 1) if tokens else 0.0,
            "finish": sorted({run["finish"] for run in own}),
            "eos_unparsed": sum(run["finish"] == "eos" and not run["parsed"] for run in own)
            if config != "unconstrained"
            else 0,
        }
    return table


def decode_speed(gen: ortgen.TextGenerator, cases: dict[str, Case], rounds: int) -> dict[str, Any]:
    """Part 2 (see module doc)."""
    table = {name: summarize_case(runs) for name, runs in decode_rounds(gen, cases, rounds).items()}
    lowest = min(rows["schema"]["x_unconstrained"]["median"] for rows in table.values())
    return {
        "note": "answers differ in length and content between configurations: compare "
        "decode tokens/s, not time per answer",
        "cases": table,
        "goal": {"schema_x_at_least": SPEED_GOAL, "lowest_x": lowest, "met": lowest >= SPEED_GOAL},
    }


# -- output -----------------------------------------------------------------------------


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        cells = [cell.rjust(width) for cell, width in zip(row, widths, strict=True)]
        cells[0] = row[0].ljust(widths[0])
        print("  " + "  ".join(cells))


def print_mask(report: dict[str, Any]) -> None:
    answers = report["answers"]
    print(
        f"Mask cost: {answers['schemas']} schemas answered greedy ({answers['tokens']} tokens; "
        f"{answers['finished_eos']} ended with eos, {answers['eos_parsed']} of them parsed)"
    )
    header = ["microseconds per call", "count", "p50", "p99", "max", "mean"]
    rows = []
    for where, table in report["timings_us"].items():
        rows.append([where] + [""] * (len(header) - 1))
        for label, row in table.items():
            figures = [row.get(k, "-") for k in ("count", "p50_us", "p99_us", "max_us", "mean_us")]
            rows.append([f"  {label}"] + [str(figure) for figure in figures])
    print_table(header, rows)
    goal = report["goal"]
    print(
        f"  goal: mask per step p99 <= {goal['p99_us_at_most']:.0f} us: "
        f"{'met' if goal['met'] else 'NOT met'} ({goal['p99_us']:.0f} us)"
    )
    if answers["unfinished"]:
        print(f"  not finished within {MASK_NEW_TOKENS} tokens: {', '.join(answers['unfinished'])}")


def print_decode(report: dict[str, Any], rounds: int) -> None:
    print(f"\nDecode speed: median [min-max] over {rounds} alternated rounds, greedy.")
    print(f"  Note: {report['note']}.")
    header = ["schema / configuration", "tok/s", "x unconstr.", "ms/forward", "ms/answer",
              "tokens", "forced", "fwd saved", "finish"]  # fmt: skip
    rows = []
    for name, table in report["cases"].items():
        rows.append([name] + [""] * (len(header) - 1))
        for config, row in table.items():
            tok, ratio, ms = row["decode_tok_s"], row["x_unconstrained"], row["answer_ms"]
            rows.append([
                f"  {config}",
                f"{tok['median']:.1f} [{tok['min']:.0f}-{tok['max']:.0f}]",
                f"{ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}]",
                f"{row['ms_per_forward']:.2f}",
                f"{ms['median']:.0f} [{ms['min']:.0f}-{ms['max']:.0f}]",
                f"{row['tokens']:g}",
                f"{row['forced']:g}",
                f"{row['forwards_saved_pct']:.0f}%",
                "/".join(row["finish"]) + (f" ({row['eos_unparsed']} unparsed!)"
                                           if row["eos_unparsed"] else ""),
            ])  # fmt: skip
    print_table(header, rows)
    goal = report["goal"]
    print(
        f"  goal: schema >= {goal['schema_x_at_least']}x unconstrained decode tok/s on every "
        f"schema: {'met' if goal['met'] else 'NOT met'} (lowest median {goal['lowest_x']:.2f}x)"
    )
    key_heavy = report["cases"].get("key_heavy")
    if key_heavy:
        schema, plain = key_heavy["schema"], key_heavy["schema, no fast-forward"]
        print(
            f"  key-heavy form: fast-forward {schema['x_unconstrained']['median']:.2f}x "
            f"unconstrained ({schema['forced']:g} of {schema['tokens']:g} tokens forced), "
            f"without it {plain['x_unconstrained']['median']:.2f}x"
        )


# -- main -------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--schemas", nargs="+", help="restrict both parts to these schemas")
    parser.add_argument("--skip-mask", action="store_true", help="only the decode part")
    parser.add_argument("--skip-decode", action="store_true", help="only the mask part")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--out", default="benchmarks/results/structured.json")
    args = parser.parse_args()

    cases = all_cases()
    corpus = {name: case for name, case in cases.items() if name not in OWN}
    mask_cases = pick_cases(args.schemas, cases) if args.schemas else corpus
    decode_cases = pick_cases(args.schemas or list(DECODE_DEFAULT), cases)
    gen = ortgen.load(threads=args.threads)
    report: dict[str, Any] = {
        "ortgen": ortgen.__version__,
        "threads": args.threads,
        "rounds": args.rounds,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_average_at_start": os.getloadavg()[0],
    }
    if not args.skip_mask:
        report["mask"] = mask_cost(gen, mask_cases)
    if not args.skip_decode:
        report["decode"] = decode_speed(gen, decode_cases, args.rounds)
    report["load_average_at_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"ortgen {report['ortgen']}, default model, {args.threads} thread(s), "
              f"load average {report['load_average_at_start']:.2f} -> "
              f"{report['load_average_at_end']:.2f}\n")  # fmt: skip
        if "mask" in report:
            print_mask(report["mask"])
        if "decode" in report:
            print_decode(report["decode"], args.rounds)
    out = Path(args.out)  # benchmarks/results/ is git-ignored
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    log(f"written {out}")


if __name__ == "__main__":
    main()
