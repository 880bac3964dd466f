"""Helpers for testing a component without a model: a request context and contract checks.

A plugin's own tests can build its components the way the loop does and call them the
way the loop does; the checks are the loop's own, so a component that passes them here
will not be rejected there.

    from ortgen.testing import check_logits_processor, make_context
    out = check_logits_processor(MyProcessor(alpha=0.5, ctx=make_context(vocab_size=64)))
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import GenerationConfig
from ..errors import ComponentError
from ..loop.component_checks import check_candidates, check_ids, check_scores, check_stop
from ..protocols import GenerationContext, LogitsProcessor, Sampler, StoppingCriterion
from ..protocols.candidates import Candidates

if TYPE_CHECKING:
    from ..model.session import GraphSignature


def make_context(
    *,
    vocab_size: int | None = None,
    batch_size: int = 1,
    prompt_length: int = 4,
    eos_token_ids: tuple[int, ...] | list[int] = (),
    pad_token_id: int = 0,
    max_length: int | None = None,
    seed: int | None = None,
    config: GenerationConfig | None = None,
    tokenizer: Any = None,
    signature: GraphSignature | None = None,
    model_config: Mapping[str, Any] | None = None,
    model_state: dict[str, Any] | None = None,
    row_seeds: tuple[int | None, ...] = (),
    extras: Mapping[str, Any] | None = None,
) -> GenerationContext:
    """A ``GenerationContext`` for a component under test, as the loop would build it;
    unspecified facts get small defaults.

    Every fact is the context's own field (``ctx.tokenizer``, ``ctx.signature``,
    ``ctx.model_config``...), so a component reads it where it will read it in a real
    request; an unknown keyword is a TypeError rather than a fact the component never
    sees. ``vocab_size`` defaults to the signature's (else 32), as a model's scores are
    as wide as its graph's logits.
    """
    if signature is not None and vocab_size not in (None, signature.vocab_size):
        raise ValueError(
            f"vocab_size={vocab_size} but the signature's graph scores "
            f"{signature.vocab_size} tokens; leave vocab_size out to take the signature's"
        )
    if vocab_size is None:
        vocab_size = signature.vocab_size if signature is not None else 32
    return GenerationContext(
        config=config or GenerationConfig(seed=seed),
        batch_size=batch_size,
        prompt_length=prompt_length,
        vocab_size=vocab_size,
        eos_token_ids=tuple(eos_token_ids),
        pad_token_id=pad_token_id,
        max_length=max_length if max_length is not None else prompt_length + 16,
        signature=signature,
        seed=seed,
        extras=dict(extras or {}),
        tokenizer=tokenizer,
        row_seeds=tuple(row_seeds),
        model_config=dict(model_config or {}),
        model_state=model_state if model_state is not None else {},
    )


def sample_inputs(
    *, batch_size: int = 2, vocab_size: int = 32, length: int = 6, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Random ``input_ids`` (B, T) int64 and ``scores`` (B, V) float32, as the loop passes them."""
    rng = np.random.default_rng(seed)
    input_ids = rng.integers(0, vocab_size, size=(batch_size, length), dtype=np.int64)
    scores = rng.standard_normal((batch_size, vocab_size)).astype(np.float32)
    return input_ids, scores


def check_logits_processor(
    processor: LogitsProcessor,
    input_ids: np.ndarray | None = None,
    scores: np.ndarray | None = None,
) -> np.ndarray:
    """Call ``processor`` once and check the contract: (B, V) floats out, inputs untouched."""
    input_ids, scores, out = _call(processor, input_ids, scores)
    check_scores(_name(processor), out, scores.shape, step=0)
    return out


def check_sampler(
    sampler: Sampler, input_ids: np.ndarray | None = None, scores: np.ndarray | None = None
) -> np.ndarray:
    """Call ``sampler`` once and check it returns one valid token id per row."""
    input_ids, scores, out = _call(sampler, input_ids, scores)
    return check_ids(_name(sampler), out, scores.shape[0], scores.shape[1], step=0)


def check_stopping_criterion(
    criterion: StoppingCriterion,
    input_ids: np.ndarray | None = None,
    scores: np.ndarray | None = None,
) -> np.ndarray:
    """Call ``criterion`` once and check it returns one bool per row."""
    input_ids, scores, out = _call(criterion, input_ids, scores)
    return check_stop(_name(criterion), out, scores.shape[0], step=0)


def check_sparse(
    component: LogitsProcessor | Sampler,
    input_ids: np.ndarray | None = None,
    scores: np.ndarray | None = None,
    *,
    keep: int = 4,
) -> Any:
    """Check that ``component.sparse`` equals its dense call on the same candidates.

    The candidates are the ``keep`` highest scores of each row (the rest ``-inf``, as
    after top-k). A processor's ``sparse`` must return Candidates whose ``dense()`` equals
    its ``__call__`` on those scores, bit for bit (or None: be called dense); a sampler's
    must pick the same ids, from the same random state (the dense call runs on a deep
    copy made first). Returns what ``sparse`` returned.
    """
    if input_ids is None or scores is None:
        input_ids, scores = sample_inputs()
    scores = np.asarray(scores, dtype=np.float32)
    keep = min(keep, scores.shape[1])
    kth = np.sort(scores, axis=1)[:, -keep, None]
    few = Candidates.find(np.where(scores >= kth, scores, np.float32(-np.inf)))
    if few is None:  # too few scores per row to be worth packing: pack them anyway
        few = Candidates.at(scores, np.flatnonzero(scores >= kth))
    sparse = getattr(component, "sparse", None)
    if sparse is None:
        raise ComponentError(f"{_name(component)} has no sparse method")
    twin = copy.deepcopy(component)
    dense_scores = few.dense()
    out = sparse(input_ids, few)
    expected = twin(input_ids, dense_scores)
    if isinstance(expected, np.ndarray) and expected.dtype.kind == "f":  # a processor
        if out is None:
            return None
        check_candidates(_name(component), out, dense_scores.shape, step=0)
        same = np.array_equal(out.dense(), expected, equal_nan=True)
    else:
        same = np.array_equal(np.asarray(out), np.asarray(expected))
    if not same:
        raise ComponentError(
            f"{_name(component)}.sparse differs from its dense call on the same candidates"
        )
    return out


def _call(
    component: Any, input_ids: np.ndarray | None, scores: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, Any]:
    """Call ``component`` as the loop does (sample inputs when none are given); no component
    may change its arguments, so they are compared with copies taken before the call."""
    if input_ids is None or scores is None:
        input_ids, scores = sample_inputs()
    before = input_ids.copy(), scores.copy()
    out = component(input_ids, scores)
    for label, old, new in zip(("input_ids", "scores"), before, (input_ids, scores), strict=True):
        if not np.array_equal(old, new, equal_nan=label == "scores"):
            raise ComponentError(f"{_name(component)} modified its {label} argument in place")
    return input_ids, scores, out


def _name(component: object) -> str:
    return type(component).__name__
