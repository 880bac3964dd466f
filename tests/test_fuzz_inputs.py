"""Fuzzing what users hand ortgen: pipeline files, ``--set`` flags, chat messages and the
rows of a job.

The property everywhere: a clear ``OrtgenError`` (ConfigError, InputError, ...) or a
valid result, never another exception, a traceback or a hang. Values come from two
sides: every known key with values of its own type and of any other, and documents,
lines and bytes of any shape. Where the strategies give valid inputs often enough,
a floor says how many must get a result rather than an error (``answering``). Bounded by
the hypothesis profile (``tests/conftest.py``; ``make fuzz`` runs more).
"""

from __future__ import annotations

import json
import math
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from ortgen import OrtgenError
from ortgen.cli.args import component_spec, key_value, settings_of
from ortgen.cli.parser import build_parser
from ortgen.config import resolve
from ortgen.config.pipeline import _OUTPUT_KEYS, _TOP_LEVEL, Pipeline, load_pipeline
from ortgen.config.run_options import _RUN_DEFAULTS
from ortgen.errors import ConfigError, InputError
from ortgen.jobs.rows import RowChecker, read_rows
from ortgen.request.prompts import BATCH_WIDE_SETTINGS
from tests.fuzz_settings import ANSWERED, REFUSED, answering, fuzz, outcome
from tests.fuzz_values import (
    COMPONENT_KINDS,
    FLOAT,
    JSON_VALUE,
    KEY,
    REGISTRY,
    SETTING_KEYS,
    SMALL_INT,
    SPELLABLE,
    TEXT,
    TOML_VALUE,
    typed_value,
)

# The floors (``answering``): the share of examples that must get a result rather than an
# error. Each comment gives the shares a working build got in 5 runs of `make test`'s
# count (and of 1000 under `make fuzz`); each floor sits well below the lowest.


@st.composite
def components(draw: st.DrawFn, key: str) -> Any:
    """A component table: a registered name (or not) and its parameters (or others)."""
    kind = COMPONENT_KINDS[key]
    name = draw(st.one_of(st.sampled_from(REGISTRY.names(kind)), TEXT))
    accepted = list(REGISTRY.get(kind, name).parameters()) if name in REGISTRY.names(kind) else []
    keys = st.sampled_from(accepted) if accepted else KEY
    params = draw(st.dictionaries(st.one_of(keys, KEY), TOML_VALUE, max_size=3))
    table = {"name": name, **params}
    return draw(st.one_of(st.sampled_from([table, name, [table]]), TOML_VALUE))


@st.composite
def pipeline_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A pipeline document: known top-level keys (and others), each with a table of its
    own known keys (and others) holding values of their type (and others)."""
    doc: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from([*_TOP_LEVEL, "bogus"]), max_size=5, unique=True)):
        if key == "generation":
            names = draw(st.lists(st.sampled_from(SETTING_KEYS), max_size=5, unique=True))
            doc[key] = {name: draw(typed_value(name)) for name in names}
        elif key == "run":
            names = draw(st.lists(st.sampled_from([*_RUN_DEFAULTS, "bogus"]), max_size=4))
            doc[key] = {
                name: draw(st.one_of(st.sampled_from(["local", "ray", "h:1"]), TOML_VALUE))
                for name in names
            }
        elif key == "output":
            names = draw(st.lists(st.sampled_from([*_OUTPUT_KEYS, "regex"]), max_size=2))
            doc[key] = {name: draw(typed_value(name)) for name in names}
        elif key == "plugins":
            doc[key] = {"disable": draw(st.lists(TEXT, max_size=2))}
        elif key == "model":
            doc[key] = draw(st.one_of(TEXT, st.text(min_size=250, max_size=400)))
        elif key in COMPONENT_KINDS:
            if key in ("logits_processors", "stopping_criteria"):
                doc[key] = [draw(components(key)) for _ in range(draw(st.integers(0, 3)))]
            else:
                doc[key] = draw(components(key))
        else:
            doc[key] = draw(TOML_VALUE)
        if draw(st.integers(0, 9)) == 0:  # now and then, a value of the wrong shape
            doc[key] = draw(TOML_VALUE)
    return doc


# -- TOML text -------------------------------------------------------------------------


def toml_value(value: Any) -> str:
    """``value`` as TOML (tables inline), for the reader to parse back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (
            f"{json.dumps(str(k), ensure_ascii=False)} = {toml_value(v)}" for k, v in value.items()
        )
        return "{" + ", ".join(items) + "}"
    raise TypeError(type(value))


def toml_text(doc: dict[str, Any]) -> str:
    return "".join(
        f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}\n" for k, v in doc.items()
    ).replace("\x7f", "\\u007f")


# -- pipeline files --------------------------------------------------------------------


def check_pipeline(pipeline: Pipeline) -> None:
    """A pipeline that loads is one a request can use: its layer resolves, its options
    have their types."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resolve([("pipeline", pipeline.settings)])
    run = pipeline.run
    assert run.engine in ("local", "ray")
    for value in (run.batch_size, run.window, run.workers):
        assert isinstance(value, int) and not isinstance(value, bool) and value >= 1
    assert pipeline.model is None or isinstance(pipeline.model, str)
    pipeline.model_path()


def load_or_error(source: Any) -> Pipeline | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return load_pipeline(source, registry=REGISTRY)
        except OrtgenError:
            return None


@fuzz(60)  # no floor: 2-4 of 60 documents load (4% of 1000), too few to count on
@given(doc=pipeline_docs())
def test_pipeline_document(doc):
    """A document (the mapping the reader checks, and the same as a TOML file) loads
    into a usable pipeline or fails with an OrtgenError; both ways agree."""
    pipeline = load_or_error(doc)
    event("loaded" if pipeline is not None else "refused")
    if pipeline is not None:
        check_pipeline(pipeline)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "pipeline.toml"
        path.write_text(toml_text(doc), encoding="utf-8")
        from_file = load_or_error(path)
    if from_file is not None:
        check_pipeline(from_file)
    # a relative [output] json_schema is found beside the file, not in this folder
    if not isinstance(doc.get("output"), dict) or "json_schema" not in doc["output"]:
        assert (pipeline is None) == (from_file is None), doc


@fuzz(100)
@given(content=st.one_of(st.binary(max_size=200), st.text(max_size=200)))
def test_pipeline_file_of_any_bytes(content):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "pipeline.toml"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        pipeline = load_or_error(path)
    if pipeline is not None:
        check_pipeline(pipeline)


@answering(0.6)  # 100% (100%): no list of names is refused
@fuzz(15)
@given(disable=st.lists(st.one_of(TEXT, st.sampled_from(["example", "ortgen.plugins"]))))
def test_pipeline_plugin_list(disable):
    """``[plugins] disable`` with any names, checked against the installed plugins."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            pipeline = load_pipeline({"plugins": {"disable": disable}, "sampler": "greedy"})
        except OrtgenError:
            outcome(REFUSED)
            return
    outcome(ANSWERED)
    assert pipeline.disable_plugins == tuple(disable)


def test_a_path_the_system_refuses_is_a_config_error():
    """Found writing the fuzz tests: an ``[output] json_schema`` file name (or a ``model`` folder)
    longer than the system allows raised OSError out of the reader."""
    with pytest.raises(ConfigError, match=r"\[output\] json_schema: .* is no file name"):
        load_pipeline({"output": {"json_schema": "s" * 300 + ".json"}}, registry=REGISTRY)
    pipeline = load_pipeline({"model": "m" * 300}, registry=REGISTRY)
    assert pipeline.model_path() == Path("m" * 300)


# -- --set and component flags ---------------------------------------------------------

PARSER = build_parser()
SET_ITEM = st.one_of(
    st.text(max_size=30),
    st.builds(
        lambda key, value: f"{key}={value}",
        st.sampled_from(SETTING_KEYS),
        st.one_of(
            JSON_VALUE.map(json.dumps),
            st.text(max_size=12),
            st.sampled_from(["NaN", "-Infinity", "1e999", "[", "{"]),
        ),
    ),
)
SPEC = st.one_of(
    st.text(max_size=30),
    st.builds(
        lambda name, items: name + (":" + ",".join(items) if items else ""),
        st.sampled_from(["prefix", "dynamic", "sliding_window", "prompt_lookup", "x"]),
        st.lists(st.builds("{}={}".format, st.text(max_size=6), st.text(max_size=8)), max_size=3),
    ),
)


@answering(0.03)  # 8-21% (16%)
@fuzz(150)
@given(items=st.lists(SET_ITEM, max_size=4), cache=st.none() | SPEC, drafter=st.none() | SPEC)
def test_set_flags(items, cache, drafter):
    """``--set KEY=VALUE`` (and ``--cache``/``--drafter`` specs): the call layer, or an
    OrtgenError; the layer then resolves or fails with a ConfigError."""
    argv = ["generate", "hi"]
    for item in items:
        argv += [f"--set={item}"]
    if cache is not None:
        argv.append(f"--cache={cache}")
    if drafter is not None:
        argv.append(f"--drafter={drafter}")
    args = PARSER.parse_args(argv)
    try:
        settings = settings_of(args)
    except OrtgenError:
        outcome(REFUSED)
        return
    assert isinstance(settings, dict)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            resolve([("call", settings)])
        except OrtgenError:
            outcome(REFUSED)
            return
    outcome(ANSWERED)


def test_set_value_nested_too_deep_is_an_error():
    """Found writing the fuzz tests: JSON nested deeper than Python's recursion limit raised
    RecursionError from ``--set``, a traceback instead of a message."""
    with pytest.raises(OrtgenError, match="nested too deep"):
        key_value("bad_words_ids=" + "[" * 100_000, "--set takes KEY=VALUE")
    with pytest.raises(OrtgenError, match="nested too deep"):
        component_spec("prefix:x=" + "[" * 100_000)


# -- chat messages ---------------------------------------------------------------------

ROLE = st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "developer"]), TEXT)
PART = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(TEXT, JSON_VALUE)}),
    st.fixed_dictionaries({"type": st.one_of(TEXT, JSON_VALUE)}, optional={"text": JSON_VALUE}),
    JSON_VALUE,
)
TOOL_CALL = st.one_of(
    st.fixed_dictionaries(
        {
            "id": TEXT,
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": TEXT, "arguments": st.one_of(TEXT, JSON_VALUE)}
            ),
        }
    ),
    JSON_VALUE,
)
#: a message a template takes
PLAIN_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": SPELLABLE}
)
#: a message: plain, an object of the right shape (its values of any type), or any object
MESSAGE_OBJECT = st.one_of(
    PLAIN_MESSAGE,
    PLAIN_MESSAGE,
    st.fixed_dictionaries(
        {"role": ROLE, "content": st.one_of(TEXT, TEXT, st.lists(PART, max_size=3), JSON_VALUE)},
        optional={
            "tool_calls": st.lists(TOOL_CALL, max_size=2),
            "name": JSON_VALUE,
            "tool_call_id": JSON_VALUE,
        },
    ),
    st.dictionaries(st.text(max_size=8), JSON_VALUE, max_size=3),
)
MESSAGE = st.one_of(MESSAGE_OBJECT, JSON_VALUE)
#: messages as a list (of anything), a tuple, a single message or a string; a value
#: list() cannot take (None, a number): an InputError (test_chat_prompt_of_no_list...)
MESSAGES = st.one_of(
    st.lists(PLAIN_MESSAGE, min_size=1, max_size=3),
    st.lists(MESSAGE, max_size=4),
    st.lists(MESSAGE, max_size=2).map(tuple),
    MESSAGE_OBJECT,
    TEXT,
)
TOOL = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": st.one_of(st.sampled_from(["f", "get_weather"]), TEXT)},
                optional={
                    "description": TEXT,
                    "parameters": st.one_of(
                        st.just({"type": "object", "properties": {"x": {"type": "integer"}}}),
                        JSON_VALUE,
                    ),
                },
            ),
        }
    ),
    JSON_VALUE,
)


@pytest.fixture(scope="module")
def text_gen(tiny_text_model):
    import ortgen

    return ortgen.load(tiny_text_model, threads=1)


@answering(0.04)  # 12-15% (16%)
@fuzz(150)
@given(
    messages=MESSAGES,
    options=st.dictionaries(
        st.sampled_from(
            [
                "continue_final_message",
                "add_generation_prompt",
                "documents",
                "enable_thinking",
                "tools",
            ]
        ),
        JSON_VALUE,
        max_size=2,
    ),
)
def test_chat_prompt(text_gen, messages, options):
    """Any messages (and template options) to the chat template: token ids, or an
    InputError naming what is wrong."""
    try:
        ids = text_gen.chat_prompt(messages, **options)
    except OrtgenError as exc:
        event(f"refused: {type(exc).__name__}")
        outcome(REFUSED)
        return
    outcome(ANSWERED)
    assert isinstance(ids, list) and all(isinstance(t, int) for t in ids)
    assert all(0 <= t < text_gen.model.signature.vocab_size for t in ids)


@answering(0.03)  # 10-22% (18%); 40 examples gave 4-9 answers, too few for a floor
@fuzz(100)
@given(
    messages=st.lists(MESSAGE_OBJECT, min_size=1, max_size=3),
    tools=st.none() | st.lists(TOOL, max_size=2),
    tool_choice=st.none() | st.sampled_from(["auto", "none", "required"]) | JSON_VALUE,
    response_format=st.none()
    | st.sampled_from([{"type": "json_object"}, {"type": "text"}, {"type": "json_schema"}, "json"]),
)
def test_chat_answers(text_gen, messages, tools, tool_choice, response_format):
    """``gen.chat()`` (the API's chat entry) with any messages, tools and formats."""
    try:
        out = text_gen.chat(
            messages,
            tools=tools,
            tool_choice=tool_choice,
            response_format=response_format,
            max_new_tokens=3,
        )
    except OrtgenError as exc:
        event(f"refused: {type(exc).__name__}")
        outcome(REFUSED)
        return
    outcome(ANSWERED)
    assert isinstance(out.text, str)


@answering(0.04)  # 13-33% (16%); 30 examples gave 4-10 answers, too few for a floor
@fuzz(80)
@given(
    conversations=st.one_of(
        st.lists(st.lists(PLAIN_MESSAGE, max_size=2), min_size=1, max_size=2),
        st.lists(st.lists(MESSAGE, max_size=2), max_size=2),
        JSON_VALUE,
    ),
    contents=st.one_of(st.lists(SPELLABLE, min_size=1, max_size=2), JSON_VALUE),
)
def test_chat_batch(text_gen, conversations, contents):
    """``chat_batch`` with any conversations, then one turn with any contents."""
    try:
        batch = text_gen.chat_batch(conversations, max_new_tokens=2)
        answers = batch.send(contents)
    except OrtgenError as exc:
        event(f"refused: {type(exc).__name__}")
        outcome(REFUSED)
        return
    outcome(ANSWERED)
    assert len(answers) == len(batch.conversations)


def test_chat_prompt_of_no_list_is_an_input_error(text_gen):
    """Found by fuzzing: chat_prompt() called list(messages) before the template checked
    them (TypeError)."""
    with pytest.raises(InputError, match="messages must be"):
        text_gen.chat_prompt(None)


def test_chat_with_tools_and_a_message_that_is_no_object_is_an_input_error(text_gen):
    """Found by fuzzing: plan_tools() called dict(m) on each message before checking it
    (TypeError)."""
    with pytest.raises(InputError, match=r"messages\[0\] is a NoneType"):
        text_gen.chat([None], tools=[], max_new_tokens=1)


def test_chat_batch_of_no_list_is_an_input_error(text_gen):
    """Found by fuzzing: ``chat_batch(True)`` and ``send(3)`` raised TypeError."""
    with pytest.raises(InputError, match="a list of conversations"):
        text_gen.chat_batch(True)
    batch = text_gen.chat_batch([[{"role": "user", "content": "hi"}]], max_new_tokens=1)
    with pytest.raises(InputError, match="one message per conversation"):
        batch.send(3)


# -- job rows --------------------------------------------------------------------------

ROW_SETTING = st.sampled_from([*SETTING_KEYS, *BATCH_WIDE_SETTINGS])
ROW = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "id": st.one_of(st.integers(), TEXT, JSON_VALUE),
            "prompt": st.one_of(TEXT, st.lists(SMALL_INT, max_size=5), JSON_VALUE),
            "messages": MESSAGES,
        },
    ).flatmap(
        lambda row: st.dictionaries(ROW_SETTING, JSON_VALUE, max_size=2).map(
            lambda own: {**row, **own}
        )
    ),
    JSON_VALUE,
)


def check_settings(own: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resolve([("call", own)])


@fuzz(200)  # no floor: 3-13 of 200 rows are requests (3% of 1000), too few to count on
@given(number=st.integers(1, 10**6), data=ROW)
def test_row_checker(number, data):
    """Any parsed row: a request, or an error row that says why; never an exception."""
    row = RowChecker(check_settings)(number, "line", data)
    event("request" if row.error is None else "error row")
    assert (row.request is None) != (row.error is None)
    assert row.error is None or isinstance(row.error, str)
    assert isinstance(row.id, str | int) and not isinstance(row.id, bool)


LINE = st.one_of(
    ROW.map(lambda row: json.dumps(row).encode()),
    st.binary(max_size=40),
    st.just(b"[" * 100_000),
)


@fuzz(60)
@given(lines=st.lists(LINE, max_size=6))
def test_read_rows_of_any_lines(lines):
    """Any JSONL file: one InputRow per non-blank line, numbered by its line."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "in.jsonl"
        path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines))
        rows = list(read_rows(path, RowChecker(check_settings)))
    assert [r.number for r in rows] == [
        i for i, line in enumerate(lines, start=1) if line.replace(b"\n", b" ").strip()
    ]


def test_a_row_nested_too_deep_is_an_error_row(tmp_path):
    """Found writing the fuzz tests: a line nested deeper than the recursion limit raised
    RecursionError out of read_rows and stopped the whole job."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n' + b"[" * 100_000 + b"\n")
    rows = list(read_rows(path, RowChecker()))
    assert rows[0].request == {"prompt": "a"}
    assert rows[1].error is not None and "nested too deep" in rows[1].error


def test_an_input_path_the_system_refuses_is_an_input_error():
    """Found writing the fuzz tests: a file name longer than the system allows raised OSError."""
    with pytest.raises(InputError, match="too long"):
        list(read_rows("x" * 300 + ".jsonl", RowChecker()))


JOB_ROW = st.fixed_dictionaries(
    {
        "prompt": st.one_of(
            st.text(min_size=1, max_size=8), st.lists(st.integers(0, 300), max_size=4)
        )
    },
    optional={
        "max_new_tokens": st.one_of(st.integers(-1, 4), JSON_VALUE),
        "temperature": FLOAT,
        "do_sample": st.booleans(),
        "stop_strings": st.one_of(st.lists(TEXT, max_size=2), JSON_VALUE),
        "json_object": st.booleans(),
        "logits_processors": st.sampled_from(["top_k", {"name": "top_k", "top_k": 2}, "nope"]),
    },
)


@answering(0.025)  # of the rows: 8-18% (17%); 25 examples gave 4-12 rows answered
@fuzz(60, long=200)
@given(rows=st.lists(st.one_of(JOB_ROW, ROW), min_size=1, max_size=5))
def test_run_job_answers_every_row_once(text_gen, rows):
    """``ortgen run``'s runner on any rows: one result line per row (an answer or an
    error line), whatever the rows hold."""
    from ortgen.jobs.runner import run_job

    with tempfile.TemporaryDirectory() as folder:
        source, target = Path(folder) / "in.jsonl", Path(folder) / "out.jsonl"
        lines = []
        for i, row in enumerate(rows):
            if isinstance(row, dict):
                row = {**row, "id": f"r{i}"}
            lines.append(json.dumps(row))
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            summary = run_job(
                text_gen, source, target, batch_size=2, settings={"max_new_tokens": 3},
                progress=None,
            )  # fmt: skip
        results = [json.loads(line) for line in target.read_text().splitlines()]
    event(f"rows answered: {summary.rows_ok} of {len(rows)}")
    assert summary.rows_ok + summary.errors == len(rows)
    assert len(results) == len(rows)
    for record in results:
        assert ("error" in record) != ("text" in record), record
        outcome(REFUSED if "error" in record else ANSWERED)  # each row
