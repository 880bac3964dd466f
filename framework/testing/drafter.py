"""``check_drafter``: a drafter driven through the real speculative loop on a float32
``FakeModel``, every request compared with the same request decoded without it.

Speculation is exact on a float32 graph: the loop keeps a draft only where the model
picks it, so a drafter may change how many forwards a request takes, never its tokens.
Each scenario runs twice, without and with the drafter, and asks for the same tokens,
finish reasons and log-probabilities; around the drafter a recorder checks, call by call,
what the loop promises it and what it promises the loop:

- ``draft(tokens, limit)`` returns at most ``limit`` ids in the vocabulary and leaves
  ``tokens`` (a view of the request's buffer) as it was;
- ``accepted(drafted, kept)``, when the drafter has it, follows every verified draft
  and says how many of its tokens the row kept (counted here from the output); it must
  take those two arguments. A drafter with no ``accepted`` but a method named like it
  (``accept``, ``on_accepted``) is never told and fails: the loop looks for that name.

Scenarios (one prompt each: the loop verifies one row per forward):

- ``greedy``: a prompt that repeats itself, 24 new tokens;
- ``sampled``: the same, sampled with a seed (the verified positions draw the numbers
  plain decoding draws);
- ``copying``: text that repeats itself (``repetition_penalty`` below 1), where a
  drafter that copies has drafts kept;
- ``short``: three new tokens, so the loop's ``limit`` is 1;
- ``eos``: an end-of-text id plain decoding generates mid-way, so a row ends inside a
  verified draft.

A drafter that proposed nothing in any scenario verified nothing and fails.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ComponentError
from .fake_model import FakeModel
from .stand_in import generator_with

if TYPE_CHECKING:
    from ..request.outputs import GenerationOutput

#: a prompt with repeats (an n-gram drafter finds earlier matches in it), and another
_REPEATING = [3, 17, 5, 9, 30, 3, 17, 5, 9, 30, 3, 17]
_OTHER = [11, 2, 41, 7, 7, 19, 23, 4, 1]
_SCENARIOS: dict[str, tuple[list[int], dict[str, Any]]] = {
    "greedy": (_REPEATING, {"max_new_tokens": 24, "do_sample": False}),
    "sampled": (
        _REPEATING,
        {"max_new_tokens": 24, "do_sample": True, "temperature": 0.8, "top_k": 20, "seed": 7},
    ),
    "copying": (_OTHER, {"max_new_tokens": 24, "do_sample": False, "repetition_penalty": 0.3}),
    "short": (_REPEATING, {"max_new_tokens": 3, "do_sample": False}),
    "eos": (_OTHER, {"max_new_tokens": 24, "do_sample": False, "repetition_penalty": 0.3}),
}


class _Recorder:
    """Stands between the loop and the drafter: passes every call on and writes down
    what went in and came out (``events``), checking each call as it happens."""

    def __init__(self, drafter: Any, name: str, vocab: int) -> None:
        self.drafter, self.name, self.vocab = drafter, name, vocab
        #: ("draft", row length, limit, proposal) and ("accepted", drafted, kept)
        self.events: list[tuple[Any, ...]] = []

    def draft(self, tokens: np.ndarray, limit: int) -> Sequence[int]:
        before = tokens.copy()
        proposal = self.drafter.draft(tokens, limit)
        if not np.array_equal(tokens, before):
            raise ComponentError(
                f"drafter {self.name!r} wrote into its tokens argument, a view of the "
                "request's buffer (it changes the request's tokens); copy it first"
            )
        ids = list(proposal)
        if len(ids) > limit or any(
            isinstance(t, bool) or not isinstance(t, int | np.integer) or not 0 <= t < self.vocab
            for t in ids
        ):
            raise ComponentError(
                f"drafter {self.name!r} returned {ids} for limit {limit}; expected at most "
                f"{limit} integer token ids in [0, {self.vocab})"
            )
        self.events.append(("draft", len(tokens), limit, [int(t) for t in ids]))
        return proposal


class _RecorderWithAccepted(_Recorder):
    def accepted(self, drafted: int, kept: int) -> None:
        self.events.append(("accepted", drafted, kept))
        try:
            self.drafter.accepted(drafted, kept)
        except Exception as exc:
            raise ComponentError(
                f"drafter {self.name!r} failed in accepted(drafted={drafted}, kept={kept}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc


class _RecordingFactory:
    """The drafter's factory, seen by the registry with the drafter's own signature (so
    parameters are checked and ``ctx`` is passed as they would be), recording what it
    makes."""

    def __init__(self, factory: Callable[..., Any], name: str, vocab: int) -> None:
        self.factory, self.name, self.vocab = factory, name, vocab
        self.__signature__ = inspect.signature(factory)
        self.made: list[_Recorder] = []

    def __call__(self, **kwargs: Any) -> _Recorder:
        drafter = self.factory(**kwargs)
        kind = _RecorderWithAccepted if callable(getattr(drafter, "accepted", None)) else _Recorder
        recorder = kind(drafter, self.name, self.vocab)
        self.made.append(recorder)
        return recorder


def check_drafter(
    factory: Callable[..., Any],
    params: dict[str, Any] | None = None,
    *,
    name: str = "drafter_under_test",
    model: FakeModel | None = None,
) -> dict[str, str]:
    """Run every scenario with ``factory(**params)`` (plus ``ctx=`` if it asks) as the
    drafter; returns ``{scenario: "same as without it: drafted D, kept K ..."}``.

    ``model``: a ``FakeModel`` of another layout or size (default: a ``shared`` graph, the
    default model's family). Raises ``ComponentError`` naming the scenario on a
    difference from plain decoding or a broken promise, and when nothing was drafted.
    """
    model = model or FakeModel(layout="shared")
    vocab = model.signature.vocab_size
    recording = _RecordingFactory(factory, name, vocab)
    gen = generator_with(model, "drafter", name, recording)
    spec = {"name": name, **(params or {})}
    report = {}
    for scenario, (prompt, settings) in _SCENARIOS.items():
        where = f"drafter {name!r}, scenario {scenario!r}"
        settings = {**settings, "logprobs": True}
        plain = gen.generate([prompt], **settings)
        if scenario == "eos":  # end where plain decoding is still going
            settings["eos_token_id"] = plain.tokens[0][len(plain.tokens[0]) // 2]
            plain = gen.generate([prompt], **settings)
        try:
            drafted = gen.generate([prompt], drafter=spec, **settings)
        except ComponentError as exc:
            raise ComponentError(f"{where} failed: {exc}") from exc
        except Exception as exc:
            raise ComponentError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        recorder = recording.made[-1]
        _check_accepted_name(recorder.drafter, name)
        _compare(where, plain, drafted)
        report[scenario] = _verify(where, recorder, prompt + drafted.tokens[0])
    if not any(event[0] == "draft" and event[3] for r in recording.made for event in r.events):
        raise ComponentError(
            f"drafter {name!r} proposed nothing in any scenario, so no draft was verified; "
            "it must return tokens from draft(tokens, limit) for prompts like "
            f"{_REPEATING}"
        )
    return report


def _check_accepted_name(drafter: Any, name: str) -> None:
    """A method named almost ``accepted`` is one the loop never calls (it looks for that
    name), so the drafter would never be told what was kept."""
    if callable(getattr(drafter, "accepted", None)):
        return
    methods = [m for m in dir(drafter) if not m.startswith("_") and callable(getattr(drafter, m))]
    close = difflib.get_close_matches("accepted", methods, n=1, cutoff=0.8)
    if close:
        raise ComponentError(
            f"drafter {name!r} has {close[0]}() but no accepted(drafted, kept), the name "
            "the loop calls after each verification: it is never told how many drafts "
            f"were kept (did you mean 'accepted' for {close[0]!r}?)"
        )


def _compare(where: str, plain: GenerationOutput, drafted: GenerationOutput) -> None:
    tokens, want = drafted.tokens[0], plain.tokens[0]
    logprobs, want_logprobs = (drafted.logprobs or [[]])[0], (plain.logprobs or [[]])[0]
    same_logprobs = len(logprobs) == len(want_logprobs) and np.allclose(
        logprobs, want_logprobs, atol=1e-5
    )
    if tokens != want or drafted.finish_reasons != plain.finish_reasons or not same_logprobs:
        at = next(
            (i for i, (a, b) in enumerate(zip(tokens, want, strict=False)) if a != b),
            min(len(tokens), len(want)),
        )
        raise ComponentError(
            f"{where}: the output differs from decoding without the drafter from generated "
            f"token {at} on (tokens {tokens}, finish {drafted.finish_reasons} against "
            f"{want}, {plain.finish_reasons}): speculation is exact on a float32 graph, so "
            "the drafter changed the request (did it write into the tokens it was given?)"
        )


def _verify(where: str, recorder: _Recorder, row: list[int]) -> str:
    """Each verified draft is followed by ``accepted`` with its length and the number of
    its tokens the row kept: the common prefix with what the row went on with, less a
    matching token that ended the row (it is the model's own token there)."""
    told = isinstance(recorder, _RecorderWithAccepted)
    drafted = kept_total = verified = 0
    events = recorder.events
    for i, event in enumerate(events):
        if event[0] != "draft" or not event[3]:
            continue
        _, length, _, proposal = event
        after = row[length:]
        common = next(
            (j for j, (a, b) in enumerate(zip(proposal, after, strict=False)) if a != b),
            min(len(proposal), len(after)),
        )
        kept = min(common, len(after) - 1)
        drafted, kept_total, verified = drafted + len(proposal), kept_total + kept, verified + 1
        if not told:
            continue
        nxt = events[i + 1] if i + 1 < len(events) else None
        if nxt != ("accepted", len(proposal), kept):
            raise ComponentError(
                f"{where}: after the draft {proposal} the drafter was told {nxt}, not "
                f"accepted(drafted={len(proposal)}, kept={kept})"
            )
    learns = "told accepted()" if told else "no accepted(): never told what was kept"
    return (
        f"same as without it: drafted {drafted}, kept {kept_total} in {verified} "
        f"verifications; {learns}"
    )
