"""``check_kv_cache``: a KV-cache backend driven by the real decoding loop on a
``FakeModel`` of each graph family, every scenario compared with the built-in cache the
loop is tested with.

A cache is right when the model sees, at every forward, exactly the keys and values the
tokens so far produce. The fake model's logits depend on every position a query may see,
so the check runs each scenario twice, with the cache under test and with the reference
(``dynamic`` on ``concat`` graphs, ``static`` on ``shared`` ones, both tested token for
token against transformers), and asks for the same tokens and the same log-probabilities:

- ``batch``: two prompts of different lengths (padding), greedy;
- ``sampled``: the same, sampled with a seed;
- ``rewind``: six steps, ``rewind(3)`` (``crop``), then on to the end;
- ``append``: a finished request continued with three tokens fed on top of its past;
- ``fork``: a sampled request forked with another seed, the two stepped in turns (only
  for a cache with ``fork()``);
- ``beams``: beam search with three beams, whose rows move (``reorder``).

Both graph families by default: the default model is a ``shared`` one, and a cache right
on one family can be wrong on the other. Where the request still holds its state
(``rewind``, ``append``, ``fork``), the cache's ``length`` must also be the positions the
loop fed: on a ``shared`` graph positions past a row's length are never read, so a
``crop`` that forgets nothing changes no token there, only ``length``.

On a ``shared`` graph each row's keys/values start at position 0, so prompts of different
lengths are prefilled row by row through ``select(row)``, and the loop refuses them to a
cache without it. Such a cache still serves prompts of one length (and a single row's
continuation), so it runs every scenario on those: its ``crop``, ``reorder`` and
``fork`` are checked all the same, and the report says what went untested.

A scenario the loop refuses for the cache with an ``InputError`` (such as "cannot be
forked") is reported as skipped with the message; a layout on which every scenario was
skipped checked nothing and raises. Any other difference or error raises
``ComponentError`` naming the layout and the scenario.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..api import TextGenerator
from ..errors import ComponentError, InputError
from ..protocols import ForksCache, KVCache, SelectsRow
from .fake_model import LAYOUTS, FakeModel
from .stand_in import generator_with

if TYPE_CHECKING:
    pass

#: the built-in cache each graph family's scenarios are compared with
REFERENCE = {"concat": "dynamic", "shared": "static"}
#: prompts of different lengths: left padding, and on a shared graph row by row
_PADDED = [[3, 17, 5, 9, 30], [11, 2, 41, 7, 7, 19, 23, 4, 1]]
#: prompts of one length: what a cache without select(row) serves on a shared graph
_EVEN = [[3, 17, 5, 9, 30, 6, 12], [11, 2, 41, 7, 7, 19, 23]]
_GREEDY: dict[str, Any] = {"max_new_tokens": 10, "do_sample": False, "logprobs": True}
#: what the loop's refusals ask of a cache, added to a skipped scenario's message (a
#: cache that reuses prefixes of different lengths per row needs select(row) too)
_WHAT_TO_DO = {
    "prompts of different lengths": "implement select(row) for the shared layout",
    "row by row": "implement select(row) for the shared layout",
    "another model's graph": "set the cache's signature to ctx.signature",
}

Result = list[tuple[list[int], list[float]]]  # per row: tokens and their logprobs


@dataclass(frozen=True)
class _Plan:
    """The requests one layout's scenarios make, for what the cache can serve there."""

    prompts: list[list[int]]
    append_rows: int  # rows the ``append`` scenario continues
    note: str = ""  # what the cache could not be checked on, and why


def check_kv_cache(
    factory: Callable[..., Any],
    params: dict[str, Any] | None = None,
    *,
    layout: str | None = None,
    name: str = "cache_under_test",
    exact: bool = True,
    model: FakeModel | None = None,
) -> dict[str, dict[str, str]]:
    """Run every scenario with ``factory(**params, ctx=...)`` as the cache, on each graph
    family; returns ``{layout: {scenario: "same as 'dynamic'" | "skipped: why" | "ran"}}``.

    ``layout``: only that graph family ("concat" or "shared"); both by default.
    ``exact=False`` for a cache that changes output on purpose (a window smaller than the
    sequence, quantised values): the scenarios run through the loop's checks and the fake
    model's, but are not compared. ``model``: a ``FakeModel`` of other sizes (its layout
    only). Raises ``ComponentError`` on a difference, an error, or a layout where every
    scenario was skipped.
    """
    report = {}
    for fake in _models(layout, model):
        report[fake.signature.kv_layout] = _check_layout(factory, params, fake, name, exact)
    return report


def _models(layout: str | None, model: FakeModel | None) -> list[FakeModel]:
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS} (or None: both), got {layout!r}")
    if model is not None:
        if layout is not None and layout != model.signature.kv_layout:
            raise ValueError(f"layout={layout!r} but the model is {model.signature.kv_layout!r}")
        return [model]
    return [FakeModel(layout=one) for one in ([layout] if layout else LAYOUTS)]


def _check_layout(
    factory: Callable[..., Any],
    params: dict[str, Any] | None,
    model: FakeModel,
    name: str,
    exact: bool,
) -> dict[str, str]:
    layout = model.signature.kv_layout
    gen = generator_with(model, "kv_cache", name, factory)
    spec = {"name": name, **(params or {})}
    reference = REFERENCE[layout]
    plan = _plan(gen, spec, name, layout)
    report = {}
    for scenario, run in _SCENARIOS.items():
        where = f"kv cache {name!r}, scenario {scenario!r} ({layout} graph)"
        try:
            got = run(gen, spec, plan, where)
        except InputError as exc:  # a capability the cache lacks, as the loop says
            report[scenario] = f"skipped: {_with_advice(str(exc))}"
            continue
        except ComponentError as exc:
            if str(exc).startswith(where):  # the check's own finding
                raise
            raise ComponentError(f"{where} failed: {exc}") from exc
        except Exception as exc:
            raise ComponentError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        if got is None:
            report[scenario] = "skipped: the cache has no fork() (ForksCache) -> implement fork()"
            continue
        if not exact:
            report[scenario] = "ran"
            continue
        want = run(gen, {"name": reference}, plan, f"the {reference!r} cache")
        assert want is not None  # every built-in reference forks
        _compare(where, reference, got, want)
        report[scenario] = f"same as {reference!r}" + (f" ({plan.note})" if plan.note else "")
    if all(result.startswith("skipped") for result in report.values()):
        reasons = sorted({result.removeprefix("skipped: ") for result in report.values()})
        raise ComponentError(
            f"kv cache {name!r}: every scenario on the {layout} graph was skipped, so nothing "
            f"was checked there: {'; '.join(reasons)}"
        )
    return report


def _plan(gen: TextGenerator, spec: dict[str, Any], name: str, layout: str) -> _Plan:
    """Prompts of different lengths, unless the graph is ``shared`` and the cache cannot
    ``select(row)``: the loop refuses it those, but prompts of one length still exercise
    its prefill, decode, crop, reorder and fork."""
    try:
        cache = gen.start(_EVEN, cache=spec, max_new_tokens=1).chain.cache
    except InputError:  # refused whatever the prompts: the scenarios report why
        return _Plan(_PADDED, len(_PADDED))
    except Exception as exc:
        raise ComponentError(
            f"kv cache {name!r} could not start a request ({layout} graph): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(cache, KVCache):
        raise ComponentError(
            f"kv cache {name!r}: the factory made a {type(cache).__name__}, which lacks the "
            "KVCache members (inputs, update, reorder, crop, length, nbytes)"
        )
    if layout == "shared" and not isinstance(cache, SelectsRow):
        return _Plan(
            _EVEN,
            1,
            "prompts of one length, and one row continued by append(): without select(row) "
            "the loop refuses prompts of different lengths and a batch fed several tokens "
            "at once on the shared layout",
        )
    return _Plan(_PADDED, len(_PADDED))


def _with_advice(message: str) -> str:
    advice = next((todo for marker, todo in _WHAT_TO_DO.items() if marker in message), "")
    return f"{message} -> {advice}" if advice else message


def _compare(where: str, reference: str, got: Result, want: Result) -> None:
    for row, ((tokens, logprobs), (want_tokens, want_logprobs)) in enumerate(
        zip(got, want, strict=True)
    ):
        if tokens != want_tokens or not np.allclose(
            logprobs, want_logprobs, atol=1e-4, equal_nan=True
        ):
            at = next(
                (i for i, (a, b) in enumerate(zip(tokens, want_tokens, strict=False)) if a != b),
                min(len(tokens), len(want_tokens)),
            )
            raise ComponentError(
                f"{where}, row {row}: differs from the {reference!r} cache from generated "
                f"token {at} on (tokens {tokens} against {want_tokens}; logprobs "
                f"{np.round(logprobs, 4).tolist()} against {np.round(want_logprobs, 4).tolist()}"
                "): the model saw other keys/values"
            )


def _check_length(state: Any, where: str, after: str) -> None:
    """The cache holds what the loop fed: ``length`` is the contract's "positions seen",
    and the one trace a crop that forgets nothing leaves on a ``shared`` graph."""
    held = state.chain.cache.length
    if held != state.fed:
        raise ComponentError(
            f"{where}: after {after} the cache's length is {held}, but the loop has fed "
            f"{state.fed} positions (crop(n) must leave n positions; update() must count "
            "what the forward added)"
        )


def _rows(state: Any) -> Result:
    return [(state.generated(r), state.logprobs(r)) for r in range(state.batch_size)]


def _batch(gen: TextGenerator, cache: dict[str, Any], plan: _Plan, where: str) -> Result:
    out = gen.generate(plan.prompts, cache=cache, **_GREEDY)
    return list(zip(out.tokens, out.logprobs or [], strict=True))


def _sampled(gen: TextGenerator, cache: dict[str, Any], plan: _Plan, where: str) -> Result:
    settings: dict[str, Any] = {"do_sample": True, "temperature": 0.9, "top_k": 12, "seed": 5}
    out = gen.generate(plan.prompts, cache=cache, **{**_GREEDY, **settings})
    return list(zip(out.tokens, out.logprobs or [], strict=True))


def _rewind(gen: TextGenerator, cache: dict[str, Any], plan: _Plan, where: str) -> Result:
    state = gen.start(plan.prompts, cache=cache, **{**_GREEDY, "max_new_tokens": 12})
    for _ in range(6):
        state.step()
    state.rewind(3)
    _check_length(state, where, "rewind(3)")
    while not state.is_done:
        state.step()
    _check_length(state, where, "the last step")
    return _rows(state)


def _append(gen: TextGenerator, cache: dict[str, Any], plan: _Plan, where: str) -> Result:
    prompts = plan.prompts[: plan.append_rows]
    state = gen.start(prompts, cache=cache, **{**_GREEDY, "max_new_tokens": 4})
    while not state.is_done:
        state.step()
    state.append([[5, 6, 7]] * state.batch_size)
    state.step()
    _check_length(state, where, "append() and a step")
    return _rows(state)


def _fork(gen: TextGenerator, cache: dict[str, Any], plan: _Plan, where: str) -> Result | None:
    settings = {"do_sample": True, "temperature": 1.5, "seed": 5}
    state = gen.start(plan.prompts, cache=cache, **{**_GREEDY, **settings})
    if not isinstance(state.chain.cache, ForksCache):
        return None
    for _ in range(4):
        state.step()
    twin = state.fork(seed=11)  # another draw from here on: the two must not share memory
    while not (state.is_done and twin.is_done):  # in turns: each must see its own past
        for one in (twin, state):
            if not one.is_done:
                one.step()
    _check_length(state, where, "the fork's last step")
    _check_length(twin, where + " (the fork)", "its last step")
    return _rows(state) + _rows(twin)


def _beams(gen: TextGenerator, cache: dict[str, Any], plan: _Plan, where: str) -> Result:
    out = gen.generate(
        plan.prompts, cache=cache, num_beams=3, num_return_sequences=3, max_new_tokens=10,
        do_sample=False, length_penalty=0.0,
    )  # fmt: skip
    scores = out.sequence_scores or [0.0] * len(out.tokens)
    return [(tokens, [score]) for tokens, score in zip(out.tokens, scores, strict=True)]


_SCENARIOS: dict[str, Callable[[TextGenerator, dict[str, Any], _Plan, str], Result | None]] = {
    "batch": _batch,
    "sampled": _sampled,
    "rewind": _rewind,
    "append": _append,
    "fork": _fork,
    "beams": _beams,
}
