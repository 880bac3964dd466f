"""OpenAI's batch files in ``ortgen run``: batch input lines in, batch output lines out.

An input line is ``{"custom_id", "method": "POST", "url", "body"}``. Its body is read
as the server reads a request body (``ortgen.request.openai_body``: the same checks, the
same ortgen settings, the same errors naming the field) and becomes one row of ortgen's
own shape (``"messages"`` or ``"prompt"``, settings, chat options), so it runs through
the same engines as any row: batched with the others by length, retried alone when its
batch fails, on the local engine or on Ray. ``custom_id`` is the row's id: resume finds a
line's answer by it, and a file whose lines cannot each be found again by it (a line
without one, a custom_id used twice, a line that is not JSON) stops before it starts, as
OpenAI refuses such a file when it validates it.

Each answer is written as OpenAI's batch output line: ``{"id": "batch_req_...",
"custom_id", "response": {"status_code": 200, "request_id", "body"}, "error": null}``,
the body the ``chat.completion`` or ``text_completion`` the server would answer
(``ortgen.request.openai_answer``). A line that cannot run is answered with the error
body the server would give (``{"error": {"message", "type", "param", "code"}}``, its
status) and ``"error": {"code", "message"}``: an unknown url with 404, a bad field with
400 naming it. ``/v1/responses`` and ``/v1/moderations`` lines are such error lines.

A ``/v1/embeddings`` line's body is read as the server reads it
(``ortgen.request.openai_embeddings``), its texts embedded by ``gen.embed`` (batched with
other such lines: ``embedding.RowEmbedder``), and answered with the embeddings object
the server would answer (floats or base64 as it asks); a model that cannot embed is a
400 naming ``model``, as there.

Fingerprints (``fingerprint.py``) apply as to any output, but an output line gets no
``"fingerprint"`` key (its shape is OpenAI's): :class:`BatchOutput` keeps each row's in
``OUT.prints.jsonl`` beside the output, and the job's is in ``OUT.run.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputError, OrtgenError, OutputError
from ..request.openai_answer import (
    assistant_message,
    completion_choice,
    completion_id,
    completion_object,
    finish_reason,
    usage,
)
from ..request.openai_body import (
    BodyFields,
    chat_fields,
    completion_fields,
    prediction_text,
)
from ..request.openai_embeddings import embedding_body, embeddings_object
from ..request.openai_errors import RequestError, no_route, request_error
from .embedding import EMBED_INPUT, is_embedding
from .fingerprint import prints_path
from .formats import JobFormat
from .results import FINGERPRINT, ResultLog
from .rows import InputRow, RowChecker, SettingsCheck, id_key, is_parquet, read_rows

__all__ = [
    "CHAT_URL",
    "COMPLETIONS_URL",
    "EMBEDDINGS_URL",
    "BatchOutput",
    "OpenAIBatch",
    "line_request",
]

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
#: the keys of a batch input line
LINE_KEYS = ("custom_id", "method", "url", "body")
#: endpoints OpenAI's batch API takes that ortgen does not answer, and why
NOT_HERE = {
    "/v1/responses": "ortgen has no Responses API; send the request to /v1/chat/completions",
    "/v1/moderations": "ortgen runs no moderation model",
}
_ANSWERED = f"ortgen run answers {CHAT_URL}, {COMPLETIONS_URL} and {EMBEDDINGS_URL} lines"


class OpenAIBatch(JobFormat):
    """OpenAI's batch input lines, answered with its batch output lines (JSONL)."""

    name = "openai"
    id_name = "custom_id"
    stop_message = (
        "cannot run as an OpenAI batch file: every line needs a custom_id of its own "
        "(a resumed job finds a line's answer by it)"
    )

    def __init__(self, model: str) -> None:
        self.model = model  # what an answer body calls the model

    def rows(
        self, path: str | Path, check_settings: SettingsCheck | None = None
    ) -> Iterator[InputRow]:
        for row in read_rows(path, LineChecker(check_settings)):
            # a line no custom_id names (not JSON, none in it): its answer could not be told
            yield row if row.meta is not None else replace(row, id=None)

    def checker(self, check_settings: SettingsCheck | None = None) -> RowChecker:
        return LineChecker(check_settings)

    def recheck(self, row: InputRow, checker: RowChecker) -> InputRow:
        """A line's row checked again as its line's row (``LineChecker.row``: an error
        named by the body's field); a line that cannot run stays as it is."""
        if row.error is not None or row.request is None or row.meta is None:
            return row
        assert isinstance(checker, LineChecker)
        return checker.row(row.number, row.unit, str(row.id), row.request, row.meta)

    def results(self, path: str | Path) -> ResultLog:
        if is_parquet(path):
            raise ConfigError(
                f"the output {path}: OpenAI batch output is JSONL; give a .jsonl output"
            )
        return BatchOutput(Path(path), self.model)


class LineChecker(RowChecker):
    """One batch input line to an :class:`InputRow`: the row its body makes, checked as
    any row is, with the line's url (and, when it cannot run, the error to answer) as its
    ``meta``. A line without a usable custom_id has no meta: it stops the job."""

    def __call__(self, number: int, unit: str, data: Any) -> InputRow:
        if not isinstance(data, Mapping):
            kind = "null" if data is None else type(data).__name__
            return InputRow(number, unit, number, error=f"a line must be a JSON object, got {kind}")
        custom_id = data.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            got = "none" if "custom_id" not in data else repr(custom_id)[:60]
            return InputRow(
                number, unit, number, error=f'"custom_id" must be a non-empty string, got {got}'
            )
        url, body = data.get("url"), data.get("body")
        model = body.get("model") if isinstance(body, Mapping) else None
        # the body's model too: the server's Batches API runs a file on the one it names
        meta: dict[str, Any] = {
            "url": url if isinstance(url, str) else None,
            "model": model if isinstance(model, str) else None,
        }
        try:
            request, names = line_request(data)
        except RequestError as exc:
            return _failed_row(number, unit, custom_id, exc, meta)
        return self.row(number, unit, custom_id, request, {**meta, "names": names})

    def row(
        self, number: int, unit: str, custom_id: str, request: dict[str, Any], meta: dict[str, Any]
    ) -> InputRow:
        """The row a line's body made, checked as any row is (its settings too, when
        this checker has the check), an error named by the body's field as the server
        names it (``meta["names"]``: setting -> field). A Ray worker checks again here."""
        try:
            if not is_embedding(request):  # an embedding body was read whole already
                self._check(request)
        except OrtgenError as exc:
            prompt = "messages" if "messages" in request else "prompt"
            error = request_error(exc, meta["names"], prompt=prompt)
            return _failed_row(number, unit, custom_id, error, meta)
        return InputRow(number, unit, custom_id, request=request, meta=meta)


def _failed_row(
    number: int, unit: str, custom_id: str, exc: RequestError, meta: dict[str, Any]
) -> InputRow:
    """A line that cannot run, with the error the server would answer it with."""
    error = {"status": exc.status, "type": exc.kind, "param": exc.param, "code": exc.code}
    return InputRow(number, unit, custom_id, error=exc.message, meta={**meta, "error": error})


def line_request(line: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The row (ortgen's shape) a batch input line asks for and the body field each of
    its settings came from, or the RequestError the server would answer its body with (a
    url it does not answer: 404)."""
    unknown = [key for key in line if key not in LINE_KEYS]
    if unknown:
        raise RequestError(
            f"unknown key {unknown[0]!r} in a batch line: it takes {', '.join(LINE_KEYS)}",
            param=str(unknown[0]),
        )
    method = line.get("method")
    if method != "POST":
        raise RequestError(f'method must be "POST", got {method!r:.60}', param="method")
    url = line.get("url")
    if not isinstance(url, str) or not url:
        raise RequestError(
            f"url must be an endpoint such as {CHAT_URL}, got {url!r:.60}", param="url"
        )
    if url in NOT_HERE:
        error = no_route("POST", url, f"{NOT_HERE[url]}; {_ANSWERED}")
        error.code = "unsupported_endpoint"
        raise error
    if url not in (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL):
        raise no_route("POST", url, _ANSWERED)
    body = line.get("body")
    if not isinstance(body, Mapping):
        raise RequestError(f"body must be the JSON object of a {url} request", param="body")
    if url == EMBEDDINGS_URL:
        return _embedding_row(body)
    return _chat_row(body) if url == CHAT_URL else _completion_row(body)


def _embedding_row(body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """An embedding request's row (``embedding.is_embedding``), the body read as the
    server reads it."""
    fields = embedding_body(body)
    row: dict[str, Any] = {EMBED_INPUT: fields.inputs, "pooling": fields.pooling}
    if fields.dimensions is not None:
        row["dimensions"] = fields.dimensions
    row["encoding_format"] = fields.encoding_format
    return row, {key: key for key in row}


def _chat_row(body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    fields = chat_fields(body)
    if fields.logprobs:
        raise RequestError(_NO_LOGPROBS, param="logprobs")
    prediction_text(body.get("prediction"))  # checked; it would only make the answer faster
    row = {"messages": fields.messages, **_settings(fields)}
    options = {key: value for key, value in fields.options.items() if value is not None}
    if fields.template_kwargs:
        options["chat_template_kwargs"] = fields.template_kwargs
    if fields.reasoning_effort is not None:
        options["reasoning_effort"] = fields.reasoning_effort
    return {**row, **options}, {**fields.names, **{key: key for key in options}}


def _completion_row(body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    fields = completion_fields(body)
    if len(fields.prompts) != 1:
        raise RequestError(
            f"a batch line takes one prompt, got {len(fields.prompts)}: give each prompt a "
            "line (and a custom_id) of its own",
            param="prompt",
        )
    if fields.logprobs is not None:
        raise RequestError(_NO_LOGPROBS, param="logprobs")
    return {"prompt": fields.prompts[0], **_settings(fields)}, fields.names


_NO_LOGPROBS = "logprobs are not written by ortgen run yet: leave logprobs out of a batch line"


def _settings(fields: BodyFields) -> dict[str, Any]:
    """A line's own settings (its seed too): one answer each, written whole."""
    if fields.n != 1:
        raise RequestError(
            f"n must be 1 in a batch line, got {fields.n}: each line gets one answer (give "
            "each choice a line and a custom_id of its own)",
            param="n",
        )
    if fields.stream:
        why = "stream must be false in a batch line: its answer is written whole"
        raise RequestError(why, param="stream")
    if "id" in fields.settings:  # a row's id is its custom_id
        raise RequestError("unknown field 'id' in the request body", param="id")
    seed = {} if fields.seed is None else {"seed": fields.seed}
    return {**fields.settings, **seed}


class BatchOutput(ResultLog):
    """The output of an OpenAI batch job: OpenAI's batch output lines, made from the
    engines' result lines as they are appended; resumed by ``custom_id``."""

    def __init__(self, path: Path, model: str) -> None:
        super().__init__(path)
        self.model = model
        #: each row's fingerprint, kept beside the output (``fingerprint.prints_path``)
        self.prints_file = prints_path(path)

    def _result(self, raw: bytes, number: int) -> dict[str, Any]:
        try:
            line = json.loads(raw)
        except ValueError:
            line = None
        if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
            raise InputError(
                f"{self.path} line {number} is not an OpenAI batch output line (it has no "
                "custom_id), so the job cannot resume from this file; give another output path"
            )
        return {"id": line["custom_id"]}  # its fingerprint is in the prints file

    def _repair_and_index(self) -> None:
        """The done lines (by custom_id), then the fingerprint of each from the prints
        file beside the output (``fingerprint.prints_path``): OpenAI's output line has no
        key for it. The prints file is written before the lines it names, so a line
        without one (a kill between the two writes, an output of an older ortgen) is a
        row whose settings are not known, as an ortgen line without a fingerprint; a
        print whose line is not there (its row not done) is dropped, the last one of a
        custom_id wins (a row done again)."""
        super()._repair_and_index()
        found: dict[str, str] = {}
        try:
            with self.prints_file.open("rb") as lines:
                for raw in lines:
                    entry = _print_entry(raw)
                    if entry is not None and id_key(entry[0]) in self.done:
                        found[id_key(entry[0])] = sys.intern(entry[1])
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise OutputError(f"cannot read {self.prints_file}: {exc.strerror or exc}") from exc
        self.prints.update(found)

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        batch = list(records)
        entries = [
            {"custom_id": r["id"], FINGERPRINT: r[FINGERPRINT]} for r in batch if FINGERPRINT in r
        ]
        if entries:  # first: a line is never written without its fingerprint known
            data = "".join(json.dumps(e) + "\n" for e in entries).encode()
            try:
                with self.prints_file.open("ab") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
            except OSError as exc:
                raise OutputError(
                    f"cannot write {self.prints_file}: {exc.strerror or exc}; run the same "
                    "command again to continue once the cause is fixed"
                ) from exc
        super().append([output_line(record, self.model) for record in batch])


def _print_entry(raw: bytes) -> tuple[str, str] | None:
    """A line of the prints file, or None for one torn by a kill."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    custom_id, stamp = entry.get("custom_id"), entry.get(FINGERPRINT)
    if isinstance(custom_id, str) and isinstance(stamp, str):
        return custom_id, stamp
    return None


def output_line(record: dict[str, Any], model: str) -> dict[str, Any]:
    """OpenAI's batch output line for one result line of the engines."""
    meta = record.get("meta") or {}
    if "error" in record:
        return _failed(record["id"], record["error"], meta)
    if "embeddings" in record:
        tokens = record["usage"]["prompt_tokens"]
        vectors = record["embeddings"]
        body = embeddings_object(vectors, record["encoding_format"], model, tokens)
        return _line(record["id"], {"status_code": 200, "request_id": _request_id(), "body": body})
    text = record.get("text")
    if text is None:  # token ids in, token ids out: an OpenAI answer is text
        why = "the model has no tokenizer, so its answer has no text for an OpenAI body"
        return _failed(record["id"], why, {"server_error": True})
    chat = meta.get("url") == CHAT_URL
    reason = finish_reason(record["finish_reason"])
    answer: str | dict[str, Any] = text
    if chat:
        calls = record.get("tool_calls")
        content = None if calls and not text else text
        thought = record.get("reasoning_content")
        answer = assistant_message(content, reasoning_content=thought, tool_calls=calls)
    counted = record["usage"]
    body = completion_object(
        chat,
        completion_id(chat),
        int(time.time()),
        model,
        [completion_choice(0, answer, reason)],
        usage(counted["prompt_tokens"], counted["completion_tokens"]),
    )
    return _line(record["id"], {"status_code": 200, "request_id": _request_id(), "body": body})


def _failed(custom_id: str, message: str, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The line of a request that failed: the error body the server would answer, and
    ``error``. A line the engines failed while it ran (not the request's fault) is a 500."""
    given = meta.get("error") or {}
    server = bool(meta.get("server_error"))
    error = RequestError(
        message,
        param=given.get("param"),
        status=given.get("status", 500 if server else 400),
        kind=given.get("type", "server_error" if server else "invalid_request_error"),
        code=given.get("code"),
    )
    response = {"status_code": error.status, "request_id": _request_id(), "body": error.body()}
    return _line(custom_id, response, {"code": error.code or error.kind, "message": message})


def _line(
    custom_id: str, response: dict[str, Any], error: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": response,
        "error": error,
    }


def _request_id() -> str:
    return f"req_{uuid.uuid4().hex}"
