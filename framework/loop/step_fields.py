"""What every part of the step object shares, declared once so each part type-checks alone.

``Generation`` is assembled from mixins, one job each (``feeding``, ``following``,
``picking``, ``continuing``, ``admission``); they read the same fields and call one
another. Declaring those fields and the methods called across parts here, on the base
all parts share, lets a type checker check every part on its own and tells a reader
what state a part may touch: the step object's whole state is this list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import numpy as np

if TYPE_CHECKING:
    from ..errors import ComponentError
    from ..model.session import ExportedModel, ForwardBinding
    from ..protocols.candidates import Candidates
    from ..text import Tokenizer
    from ..util.exclusive import Exclusive
    from .batch_kind import BatchKind
    from .cache_view import CacheView
    from .chain import Chain
    from .rows import RowState
    from .step_record import StepRecord

    Scores = np.ndarray | Candidates

_P = ParamSpec("_P")
_R = TypeVar("_R")


class StepFields:
    """The step object's state (see module doc); set by ``Generation`` and ``Admission.open``."""

    model: ExportedModel
    chain: Chain  #: the request's chain; it holds the cache every row shares
    rows: RowState  #: every per-row field
    record: StepRecord
    tokenizer: Tokenizer | None
    pad_token_id: int
    length: int  #: tokens in the buffer, per row (padding included)
    fed: int  #: positions the cache holds
    steps: int
    prompt_length: int
    prefill_chunk: int
    prefill_tokens: int
    fast_forward_tokens: int
    shared_prefills: int  #: open batches: rows that copied a held row's prefill
    reused_tokens: int  #: open batches: prompt tokens taken from a slot's prefix
    _groups: list[tuple[np.ndarray | None, Chain]]  #: (rows or None: all, chain) per group
    _solo: set[int]
    _batch: BatchKind  #: a request's own batch or an open one (``batch_kind.py``)
    _binding: ForwardBinding
    _driver: Exclusive
    _kv: CacheView  #: the cache's optional capabilities, found once (``cache_view.py``)
    _packed_prefill: bool
    _scoring: bool  #: a request's rows asked for prompt logprobs: its prefill scores them
    _prefilled: dict[Any, tuple[np.ndarray, int]]
    _following: bool
    _preparing: bool
    _forcing: bool
    drafted: int
    draft_kept: int
    verify_forwards: int

    if TYPE_CHECKING:  # defined by one part, called by others

        @property
        def batch_size(self) -> int: ...
        @property
        def sequences(self) -> np.ndarray: ...
        @property
        def is_done(self) -> bool: ...
        @property
        def is_search(self) -> bool: ...
        def finish(self, row: int, reason: str) -> None: ...
        def reserve(self, needed: int) -> None: ...
        def row_end(self, row: int) -> int: ...
        def _regroup(self) -> None: ...
        def _new_texts(self) -> None: ...
        def _forward(self) -> np.ndarray: ...
        def _run_row(self, row: int, first: int, end: int, keep: int = 1) -> np.ndarray: ...
        def _score_prompt(self, logits: np.ndarray, rows: np.ndarray, first: int) -> None: ...
        def _forward_chunk(self, start: int, end: int, keep: int = 1) -> np.ndarray: ...
        def _commit(
            self,
            next_ids: np.ndarray,
            logits: np.ndarray | None,
            scores: Any,
            forced: np.ndarray | None,
            failed: list,
        ) -> np.ndarray: ...
        def _finish_step(self, failed: list) -> None: ...
        def _forced_column(self) -> np.ndarray | None: ...
        def _pick(
            self, input_ids: np.ndarray, logits: np.ndarray, forced: Any, failed: list
        ) -> tuple[np.ndarray, Any]: ...
        def _cache_call(
            self, method: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs
        ) -> _R: ...
        def _setup(
            self,
            model: ExportedModel,
            chain: Chain,
            pad_token_id: int,
            tokenizer: Tokenizer | None,
            chains: Sequence[Chain],
            batch: BatchKind,
        ) -> None: ...
        def _init_open(self) -> None: ...
        def _init_following(self) -> None: ...
        def _init_speculation(self) -> None: ...
        def _select(self, row: int | None) -> None: ...
        def _chunk(self) -> int: ...
        def _note_components(self) -> None: ...
        def _tell(
            self, name: str, method: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs
        ) -> _R: ...
        def _advance(self, tokens: list[list[int]], failed: list | None = None) -> None: ...
        def _settle(
            self,
            next_ids: np.ndarray,
            active: np.ndarray,
            scores: np.ndarray | Candidates,
            failed: list[ComponentError],
            only: Sequence[int] | None = None,
        ) -> None: ...
        def _take_forced(
            self, forced: np.ndarray | None, failed: list, rows: Sequence[int] | None = None
        ) -> None: ...
        def _rewind_followers(self, new_length: int) -> None: ...
        def _refresh_forced(self, rows: Any, failed: list) -> None: ...
        def _reset_forced(self) -> None: ...
        def _force_scores(self, scores: Any, forced: np.ndarray | None) -> Any: ...
        def _check_forced(self, forced: np.ndarray, next_ids: np.ndarray) -> None: ...
        def _isolated(
            self, rows: np.ndarray | None, failed: list, work: Callable[[], Any]
        ) -> Any: ...
        def _fail_rows(self, rows: np.ndarray | None, error: Any, failed: list) -> None: ...
        def _has_failed(self, rows: np.ndarray | None) -> bool: ...
        def _group_view(
            self, rows: np.ndarray | None, chain: Chain, input_ids: np.ndarray, scores: Any
        ) -> tuple[np.ndarray, Any]: ...
        def _pick_group(
            self,
            chain: Chain,
            input_ids: np.ndarray,
            logits: np.ndarray,
            forced: np.ndarray | None = None,
        ) -> tuple[np.ndarray, Scores]: ...
        def _sample(self, chain: Chain, input_ids: np.ndarray, scores: Scores) -> np.ndarray: ...
        def _stop_group(
            self, rows: np.ndarray | None, chain: Chain, ids: np.ndarray, scores: Any
        ) -> None: ...
