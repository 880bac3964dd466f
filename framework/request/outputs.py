"""What a request produced: ``GenerationOutput`` (a whole answer) and ``StreamPiece`` (one
step of a streamed one), built from a finished step object.

Apart from ``api.py`` (which builds and drives requests) because every driver shapes
its results here: ``generate()``, chat sessions, the job runner and the server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..chat_formats.reply import ReplyPlan, read_reply
from ..loop.generate import Generation
from ..loop.prompt_scoring import TokenLogprob
from ..protocols import BeamsPerPrompt, KeepsSequenceLogprobs
from ..structured.response_format import parse_json_output
from ..text import RowText

__all__ = [
    "GenerationOutput",
    "PromptScore",
    "StreamPiece",
    "TokenLogprob",
    "output_of",
    "prompt_logprobs_of",
    "with_reply",
]


@dataclass
class GenerationOutput:
    """What one ``generate`` call produced.

    ``text`` is a str for one prompt and a list for a batch (prompt excluded, stop
    strings trimmed; None without a tokenizer). ``tokens`` holds the generated ids
    per row (no prompt, no padding; the EOS that ended a row is included, as in
    Hugging Face). ``sequences`` is Hugging Face's (B, T) array: left-padded
    prompts plus generated tokens, padded after a row finished.
    """

    text: str | list[str] | None
    tokens: list[list[int]]
    sequences: np.ndarray
    finish_reasons: list[str]
    stats: dict[str, float] = field(default_factory=dict)
    #: per row, the log-probability of each generated token (``logprobs=True``)
    logprobs: list[list[float]] | None = None
    #: per row and token, the best (token, logprob) pairs (``top_logprobs=N``)
    top_logprobs: list[list[list[tuple[int, float]]]] | None = None
    #: one (B, V) array per step: processed scores / raw logits (``output_scores`` /
    #: ``output_logits``), as transformers' ``scores`` / ``logits``
    scores: list[np.ndarray] | None = None
    logits: list[np.ndarray] | None = None
    #: beam search: each returned sequence's score (sum of log-probs / length ** penalty)
    sequence_scores: list[float] | None = None
    #: with a ``json_schema`` or ``json_object`` constraint: the parsed JSON (shaped like
    #: ``text``), None for a row that did not end as whole JSON; ``parse_errors`` says why
    parsed: Any = None
    parse_errors: Any = None
    #: with ``chat(tools=...)``: each row's tool calls in OpenAI's shape (shaped like
    #: ``text``; ``text`` is then the answer's content, "" when it is only calls)
    tool_calls: Any = None
    #: a chat with a model that thinks: each row's thought (shaped like ``text``, None
    #: for a row that did not think); ``text`` is then the answer after it
    reasoning_content: Any = None
    #: per row, each prompt token with its log-probability given the tokens before it,
    #: its rank and the best alternatives (``prompt_logprobs=N``); None for the first
    prompt_logprobs: list[list[TokenLogprob | None]] | None = None


@dataclass
class PromptScore:
    """One prompt scored (``TextGenerator.score``): its tokens, each token's
    log-probability given the tokens before it (None for the first, which has nothing
    before it), their sum, and (with ``top_logprobs=N``) each position's N best
    ``(token, logprob)`` alternatives (None for the first)."""

    tokens: list[int]
    logprobs: list[float | None]
    total: float
    top_logprobs: list[list[tuple[int, float]] | None] | None = None

    @classmethod
    def of(cls, tokens: list[int], scored: list[TokenLogprob | None], top: int) -> PromptScore:
        logprobs = [p.logprob if p is not None else None for p in scored]
        total = float(sum(v for v in logprobs if v is not None))
        tops = [p.top_logprobs if p is not None else None for p in scored] if top else None
        return cls(tokens, logprobs, total, tops)


@dataclass
class StreamPiece:
    """One step of a streamed answer (``TextGenerator.stream_pieces``)."""

    text: str  # text that became safe to show with this step ("" while held back)
    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    finish_reason: str | None = None  # set on the last piece
    #: on a row's first piece, when it asked for ``prompt_logprobs``: its prompt scored
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @classmethod
    def since(cls, state: Generation, row: int, start: int) -> list[StreamPiece]:
        """What ``row`` of ``state`` produced from buffer column ``start`` on: one piece
        per token (a speculative step may keep several), with the logprobs the row asked
        for; the text that became safe to show and, once the row ended, the finish
        reason come on the last piece. Reads only the new columns, not the whole row."""
        end = state.row_end(row)
        tokens = state.ids[row, start:end].tolist()
        if not tokens:
            return []
        record = state.record
        wanted = bool(record.wanted[row])
        logprobs = record.logprobs(row, start, end) if wanted else [None] * len(tokens)
        tops = (
            record.top_logprobs(row, start, end)
            if wanted and record.tops[row] > 0
            else [None] * len(tokens)
        )
        pieces = [
            cls(text="", token=token, logprob=logprob, top_logprobs=top)
            for token, logprob, top in zip(tokens, logprobs, tops, strict=True)
        ]
        if start == int(state.rows.prompt_end[row]) and record.prompt_tops[row] >= 0:
            pieces[0].prompt_logprobs = state.prompt_logprobs(row)
        last = pieces[-1]
        last.text = state.new_text(row) if state.tokenizer is not None else ""
        last.finish_reason = None if state.unfinished[row] else state.finish_reasons[row]
        return pieces


def output_of(state: Generation, single: bool, stats: dict[str, float]) -> GenerationOutput:
    """What a finished ``state`` produced, as one ``generate`` call returns it: texts
    (a str for one prompt), tokens, reasons, records, parsed JSON for JSON rows."""
    output = _shape_output(state, single, stats)
    if state.fast_forward_tokens:
        output.stats["fast_forward_tokens"] = float(state.fast_forward_tokens)
    if output.text is not None:
        rows = len(output.tokens)
        json_rows = [state.row_chain(min(r, state.batch_size - 1)).output_json
                     for r in range(rows)] if not state.is_search else [
            state.chain.output_json] * rows  # fmt: skip
        if any(json_rows):
            texts = [output.text] if isinstance(output.text, str) else output.text
            parsed = [
                parse_json_output(text, reason) if wanted else (None, None)
                for text, reason, wanted in zip(
                    texts, output.finish_reasons, json_rows, strict=True
                )
            ]
            values = [value for value, _ in parsed]
            errors = [error for _, error in parsed]
            output.parsed = values[0] if isinstance(output.text, str) else values
            output.parse_errors = errors[0] if isinstance(output.text, str) else errors
    return output


def _shape_output(state: Generation, single: bool, stats: dict[str, float]) -> GenerationOutput:
    steps = state.steps
    if "prefill_s" in stats and steps > 1 and "total_s" in stats:
        stats["decode_ms_per_token"] = 1e3 * (stats["total_s"] - stats["prefill_s"]) / (steps - 1)
    results = state.search_results()
    if results is not None:
        output = _search_output(state, results, single)
        output.stats = stats
        return output
    tokens = [state.generated(r) for r in range(state.batch_size)]
    texts = None
    if state.tokenizer is not None:
        texts = [state.text(r) for r in range(state.batch_size)]
    reasons = [r or "error" for r in state.finish_reasons]
    text: str | list[str] | None = texts[0] if single and texts is not None else texts
    rows = range(state.batch_size)
    record = state.record
    return GenerationOutput(
        text,
        tokens,
        state.sequences.copy(),
        reasons,
        stats,
        logprobs=[state.logprobs(r) for r in rows] if record.want_logprobs else None,
        top_logprobs=[state.top_logprobs(r) for r in rows] if record.top else None,
        scores=list(record.scores) if record.want_scores else None,
        logits=list(record.logits) if record.want_logits else None,
        prompt_logprobs=prompt_logprobs_of(state, list(rows)),
    )


def prompt_logprobs_of(
    state: Generation, rows: list[int]
) -> list[list[TokenLogprob | None]] | None:
    """``rows``' prompt logprobs, when the request asked for them."""
    if not state.record.want_prompt:
        return None
    return [state.prompt_logprobs(row) for row in rows]


def _search_output(
    state: Generation, results: tuple[list[list[int]], list[float]], single: bool
) -> GenerationOutput:
    """What a search strategy (beam search) chose: its sequences, decoded. Sequences
    come item by item, ``len(tokens) // prompts`` per prompt, best first."""
    tokens, scores = results
    search = state.chain.search
    assert search is not None, "search results come from a search strategy"
    beams = search if isinstance(search, BeamsPerPrompt) else None
    logprobs = search if isinstance(search, KeepsSequenceLogprobs) else None
    rows_per_prompt = int(beams.num_beams) if beams is not None else 1
    prompts = state.batch_size // rows_per_prompt
    per_prompt = max(1, len(tokens) // prompts)
    eos = {int(t) for t in beams.eos} if beams is not None else set()
    width = state.prompt_length + max((len(t) for t in tokens), default=0)
    sequences = np.full((len(tokens), width), state.pad_token_id, dtype=np.int64)
    prompt_rows = []
    for i, row in enumerate(tokens):
        prompt_row = min((i // per_prompt) * rows_per_prompt, state.batch_size - 1)
        prompt_rows.append(prompt_row)
        sequences[i, : state.prompt_length] = state.ids[prompt_row, : state.prompt_length]
        sequences[i, state.prompt_length : state.prompt_length + len(row)] = row
    reasons = ["eos" if row and row[-1] in eos else "length" for row in tokens]
    texts = None
    if state.tokenizer is not None:  # the greedy path's text: cut before a stop string
        texts = []
        for i, row in enumerate(tokens):
            row_text = RowText(state.tokenizer, state.chain.stop_strings)
            for token in row:
                row_text.push(token)
            texts.append(row_text.close())
            if row_text.stopped:
                reasons[i] = "stop_string"
    text: str | list[str] | None = texts[0] if single and texts is not None else texts
    record = state.record
    return GenerationOutput(
        text,
        tokens,
        sequences,
        reasons,
        logprobs=logprobs.sequence_logprobs if logprobs is not None else None,
        top_logprobs=logprobs.sequence_top_logprobs if logprobs is not None else None,
        scores=list(record.scores) if record.want_scores else None,
        logits=list(record.logits) if record.want_logits else None,
        sequence_scores=scores,
        prompt_logprobs=prompt_logprobs_of(state, prompt_rows),
    )


def with_reply(out: GenerationOutput, plan: ReplyPlan) -> None:
    """Read each row's answer (``ortgen.chat_formats.reply``): ``text`` becomes the
    content, the thought goes to ``reasoning_content``, the calls to ``tool_calls``, and a
    row that ended with whole calls finishes with "tool_calls". JSON asked of a thinking
    model is parsed from the answer after the thought, and JSON beside tools from a row
    that made no call (``parsed`` is None for a row of calls)."""
    single = isinstance(out.text, str)
    texts: list[str] = [out.text] if isinstance(out.text, str) else list(out.text or [])
    replies = [
        read_reply(text, plan, reason)
        for text, reason in zip(texts, out.finish_reasons, strict=True)
    ]
    for row, reply in enumerate(replies):
        out.finish_reasons[row] = reply.finish_reason
    contents = [reply.content or "" for reply in replies]
    out.text = contents[0] if single else contents
    if plan.tags is not None:
        thoughts = [reply.reasoning_content for reply in replies]
        out.reasoning_content = thoughts[0] if single else thoughts
    if plan.calls_allowed:
        calls = [reply.tool_calls for reply in replies]
        out.tool_calls = calls[0] if single else calls
        out.parsed = out.parse_errors = None  # the JSON was the calls' envelope
    if plan.json_answer or (plan.spec is not None and plan.spec.text_schema is not None):
        # JSON after a thought, or a text answer beside tools: a row of calls has none
        parsed = [
            parse_json_output(content, reason) if not reply.tool_calls else (None, None)
            for content, reason, reply in zip(contents, out.finish_reasons, replies, strict=True)
        ]
        values = [value for value, _ in parsed]
        errors = [error for _, error in parsed]
        out.parsed = values[0] if single else values
        out.parse_errors = errors[0] if single else errors
