"""``check_kv_cache``: a KV-cache backend driven by the real decoding loop on a
``FakeModel``, every scenario compared with the built-in cache the loop is tested with.

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

A scenario the cache refuses with a clear error (an ``InputError`` such as "cannot be
forked", a window that cannot rewind past what it dropped) is reported as skipped with
the message; any other difference or error raises ``ComponentError`` naming the
scenario.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..api import TextGenerator
from ..errors import ComponentError, InputError
from ..hookspecs import Register, hookimpl
from ..protocols import ForksCache, KVCache
from .fake_model import FakeModel

if TYPE_CHECKING:
    from ..model import ExportedModel

#: the built-in cache each graph family's scenarios are compared with
REFERENCE = {"concat": "dynamic", "shared": "static"}
_PROMPTS = [[3, 17, 5, 9, 30], [11, 2, 41, 7, 7, 19, 23, 4, 1]]
_GREEDY: dict[str, Any] = {"max_new_tokens": 10, "do_sample": False, "logprobs": True}

Result = list[tuple[list[int], list[float]]]  # per row: tokens and their logprobs


class _Plugin:
    """Registers the factory under test, as a plugin package would."""

    def __init__(self, name: str, factory: Callable[..., Any]) -> None:
        self.name, self.factory = name, factory

    @hookimpl
    def register_kv_caches(self, register: Register) -> None:
        register(self.name, self.factory)


def check_kv_cache(
    factory: Callable[..., Any],
    params: dict[str, Any] | None = None,
    *,
    layout: str = "concat",
    name: str = "cache_under_test",
    exact: bool = True,
    model: FakeModel | None = None,
) -> dict[str, str]:
    """Run every scenario with ``factory(**params, ctx=...)`` as the cache; returns
    ``{scenario: "same as 'dynamic'" | "skipped: why" | "ran"}``.

    ``layout``: the graph family ("concat" or "shared"). ``exact=False`` for a cache
    that changes output on purpose (a window smaller than the sequence, quantised
    values): the scenarios run through the loop's checks and the fake model's, but are
    not compared. ``model``: a ``FakeModel`` of other sizes.
    """
    model = model or FakeModel(layout=layout)
    layout = model.signature.kv_layout
    stand_in = cast("ExportedModel", model)  # it has what the loop uses of one
    gen = TextGenerator(model.path, model=stand_in, plugins=[_Plugin(name, factory)])
    spec = {"name": name, **(params or {})}
    reference = REFERENCE[layout]
    report = {}
    for scenario, run in _SCENARIOS.items():
        try:
            got = run(gen, spec)
        except InputError as exc:  # a capability the cache says it lacks
            report[scenario] = f"skipped: {exc}"
            continue
        except Exception as exc:
            raise ComponentError(
                f"kv cache {name!r} failed scenario {scenario!r} ({layout} graph): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if got is None:
            report[scenario] = "skipped: the cache has no fork() (ForksCache)"
            continue
        if not exact:
            report[scenario] = "ran"
            continue
        want = run(gen, {"name": reference})
        assert want is not None  # every built-in reference forks
        _compare(name, scenario, reference, got, want)
        report[scenario] = f"same as {reference!r}"
    return report


def _compare(name: str, scenario: str, reference: str, got: Result, want: Result) -> None:
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
                f"kv cache {name!r}, scenario {scenario!r}, row {row}: differs from the "
                f"{reference!r} cache from generated token {at} on (tokens {tokens} against "
                f"{want_tokens}; logprobs {np.round(logprobs, 4).tolist()} against "
                f"{np.round(want_logprobs, 4).tolist()}): the model saw other keys/values"
            )


def _rows(state: Any) -> Result:
    return [(state.generated(r), state.logprobs(r)) for r in range(state.batch_size)]


def _batch(gen: TextGenerator, cache: dict[str, Any]) -> Result:
    out = gen.generate(_PROMPTS, cache=cache, **_GREEDY)
    return list(zip(out.tokens, out.logprobs or [], strict=True))


def _sampled(gen: TextGenerator, cache: dict[str, Any]) -> Result:
    settings: dict[str, Any] = {"do_sample": True, "temperature": 0.9, "top_k": 12, "seed": 5}
    out = gen.generate(_PROMPTS, cache=cache, **{**_GREEDY, **settings})
    return list(zip(out.tokens, out.logprobs or [], strict=True))


def _started(gen: TextGenerator, cache: dict[str, Any], **settings: Any) -> Any:
    state = gen.start(_PROMPTS, cache=cache, **{**_GREEDY, **settings})
    if not isinstance(state.chain.cache, KVCache):
        raise ComponentError(
            f"the factory made a {type(state.chain.cache).__name__}, which lacks the "
            "KVCache members (inputs, update, reorder, crop, length, nbytes)"
        )
    return state


def _rewind(gen: TextGenerator, cache: dict[str, Any]) -> Result:
    state = _started(gen, cache, max_new_tokens=12)
    for _ in range(6):
        state.step()
    state.rewind(3)
    while not state.is_done:
        state.step()
    return _rows(state)


def _append(gen: TextGenerator, cache: dict[str, Any]) -> Result:
    state = _started(gen, cache, max_new_tokens=4)
    while not state.is_done:
        state.step()
    state.append([[5, 6, 7]] * state.batch_size)
    state.step()
    return _rows(state)


def _fork(gen: TextGenerator, cache: dict[str, Any]) -> Result | None:
    state = _started(gen, cache, do_sample=True, temperature=1.5, seed=5)
    if not isinstance(state.chain.cache, ForksCache):
        return None
    for _ in range(4):
        state.step()
    twin = state.fork(seed=11)  # another draw from here on: the two must not share memory
    while not (state.is_done and twin.is_done):  # in turns: each must see its own past
        for one in (twin, state):
            if not one.is_done:
                one.step()
    return _rows(state) + _rows(twin)


def _beams(gen: TextGenerator, cache: dict[str, Any]) -> Result:
    out = gen.generate(
        _PROMPTS, cache=cache, num_beams=3, num_return_sequences=3, max_new_tokens=10,
        do_sample=False, length_penalty=0.0,
    )  # fmt: skip
    scores = out.sequence_scores or [0.0] * len(out.tokens)
    return [(tokens, [score]) for tokens, score in zip(out.tokens, scores, strict=True)]


_SCENARIOS: dict[str, Callable[[TextGenerator, dict[str, Any]], Result | None]] = {
    "batch": _batch,
    "sampled": _sampled,
    "rewind": _rewind,
    "append": _append,
    "fork": _fork,
    "beams": _beams,
}
