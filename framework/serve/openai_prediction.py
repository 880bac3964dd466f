"""OpenAI's predicted outputs (``prediction`` in a chat request) as speculative decoding.

A prediction is text the answer is expected to repeat (a file rewritten with a few
edits). Its token ids become the ``reference`` of the ``prompt_lookup`` drafter
(``ortgen.plugins.drafters``): the drafter proposes what follows the answer's last tokens
in it, and the model keeps a proposed token only where it would pick it anyway. So the
answer is the one decoding without the prediction gives (token for token on float32
graphs); what changes is how many forwards it takes.

How it combines with the drafting the request or the server already asks for:

- the request names a ``drafter``: a 400 naming ``prediction`` (give one of the two);
- ``prompt_lookup_num_tokens`` (the request's or the pipeline's) and
  ``max_matching_ngram_size``: they become the drafter's ``num_tokens`` and ``max_ngram``;
- the pipeline's drafter is ``prompt_lookup``: its parameters are kept, the reference added;
- the pipeline's drafter is another one (a draft model): it stays, and the prediction has
  no effect (the answer is the same either way).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api import TextGenerator
from ..errors import ConfigError
from ..request.openai_body import prediction_text
from .errors import RequestError


def with_prediction(
    body: Mapping[str, Any],
    gen: TextGenerator,
    settings: dict[str, Any],
    names: dict[str, str],
) -> dict[str, Any]:
    """``settings`` with the ``prompt_lookup`` drafter drafting from the request's
    ``prediction`` (see module doc); ``names`` then says the drafter came from it."""
    text = prediction_text(body.get("prediction"))
    if text is None:
        return settings
    if settings.get("drafter") is not None:
        raise RequestError(
            "give prediction or drafter, not both: prediction drafts with prompt_lookup",
            param="prediction",
        )
    tokenizer = gen.tokenizer  # a served model has one (``ortgen serve`` checks)
    ids = tokenizer.encode(text, add_special_tokens=False) if text and tokenizer else []
    vocab = gen.model.signature.vocab_size
    ids = [i for i in ids if i < vocab] if vocab else ids
    if not ids:
        return settings
    try:  # what the request drafts with already, the pipeline's settings included
        config = gen.resolve_config(settings).config
    except ConfigError:
        return settings  # the request's own error is reported where it is checked
    if config.drafter is not None and config.drafter.get("name") != "prompt_lookup":
        return settings  # the server's own drafter stays
    drafter: dict[str, Any] = dict(config.drafter or {"name": "prompt_lookup"})
    if config.prompt_lookup_num_tokens:
        drafter["num_tokens"] = config.prompt_lookup_num_tokens
    if config.max_matching_ngram_size is not None:
        drafter["max_ngram"] = config.max_matching_ngram_size
    drafter["reference"] = ids
    names["drafter"] = "prediction"
    out = {**settings, "drafter": drafter}
    if config.prompt_lookup_num_tokens:  # now the drafter's num_tokens (any layer's)
        out["prompt_lookup_num_tokens"] = None
    return out
