"""Helpers for testing a plugin without a model: a request context, the loop's own
contract checks for processors, samplers and stopping criteria, for KV caches and
drafters a numpy stand-in model and scenarios run through the real loop, and for chat
formats their parser on known answers (whole and streamed) and their grammars compiled.

    from ortgen.testing import check_drafter, check_kv_cache, check_logits_processor
    out = check_logits_processor(MyProcessor(alpha=0.5, ctx=make_context(vocab_size=64)))
    report = check_kv_cache(MyCache)  # both graph families, each against its reference
    report = check_drafter(MyDrafter)  # the same tokens as decoding without it
    check_chat_format(MyFormat(), [(answer_text, ParsedAnswer(...)), ...])  # whole and streamed

And for a quantised model, its output judged against a float32 graph of the same weights
(``agreement``, ``reference_greedy``, ``NEAR_TIE``): what holds on every CPU.
"""

from .chat_format import TEXT_SCHEMA, check_chat_format, make_tool_spec
from .components import (
    check_logits_processor,
    check_sampler,
    check_sparse,
    check_stopping_criterion,
    make_context,
    sample_inputs,
)
from .drafter import check_drafter
from .fake_model import FakeModel
from .kv_cache import check_kv_cache
from .reference import NEAR_TIE, Agreement, agreement, near_tie_paths, reference_greedy

__all__ = [
    "NEAR_TIE",
    "TEXT_SCHEMA",
    "Agreement",
    "FakeModel",
    "agreement",
    "check_chat_format",
    "check_drafter",
    "check_kv_cache",
    "check_logits_processor",
    "check_sampler",
    "check_sparse",
    "check_stopping_criterion",
    "make_context",
    "make_tool_spec",
    "near_tie_paths",
    "reference_greedy",
    "sample_inputs",
]
