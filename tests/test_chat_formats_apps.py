"""Every application reads a chat answer the same way: ``gen.chat()``, a chat session
(``send``, ``send_deltas``), a chat batch, ``ortgen chat`` and an ``ortgen run`` job's
``messages`` rows split a thinking model's thought from its answer, and read a hermes
model's tool calls, alike.

One tiny Qwen3-style model (``<think>`` opened by the generation prompt) whose answer
is forced with tests/server_plugin.py's ``says``, and a copy of it with
test_tool_calls.py's hermes template for the calls.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ortgen
from ortgen.cli.main import main
from ortgen.jobs import run_job
from tests import server_plugin
from tests.test_tool_calls import HERMES_TEMPLATE, TINY_TOOLS, read_back, with_template, written
from tests.tiny_models import export_chat_family

QWEN3_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}"
    "{% endfor %}</tools> <tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{%- if m.get('reasoning_content') %}<think>\n{{ m['reasoning_content'] }}\n</think>\n\n"
    "{%- endif %}{{ m['content'] or '' }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{%- else %}<think>\n{% endif %}{% endif %}"
)
SPECIAL = ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>")
#: the generation prompt opened the thought: the model writes it, closes it, answers
ANSWER = "plan\n</think>\n\nhello"
SAYS = [{"name": "says", "text": ANSWER}]
QUESTION = [{"role": "user", "content": "hi?"}]
CALL = [("add", {"a": 3})]
CALL_SAYS = [{"name": "says", "text": written(CALL, "hermes")}]
TOOL_ROW = {"tools": TINY_TOOLS, "tool_choice": "required", "parallel_tool_calls": False}


@pytest.fixture(scope="session")
def thinking_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chat-formats-apps")
    # EOS is </s>: the family's tokens are plain added tokens here, which decode as text
    return export_chat_family(root, "qwen3ish", QWEN3_TEMPLATE, special_tokens=SPECIAL,
                              max_positions=1024)  # fmt: skip


@pytest.fixture(scope="session")
def thinking(thinking_folder: Path):
    return ortgen.load(thinking_folder, threads=1, plugins=[server_plugin])


@pytest.fixture(scope="session")
def hermes_folder(thinking_folder: Path) -> Path:
    return with_template(thinking_folder, thinking_folder.parent / "hermes", HERMES_TEMPLATE)


@pytest.fixture(scope="session")
def hermes(hermes_folder: Path):
    return ortgen.load(hermes_folder, threads=1, plugins=[server_plugin])


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def job(tmp_path: Path, folder: Path, rows: list, *args: str, capsys) -> list[dict]:
    """``ortgen run`` (in this process) over ``rows``: the result lines in input order."""
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pipeline = tmp_path / "job.toml"
    pipeline.write_text("[generation]\nmax_new_tokens = 60\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    files = ["--input", str(source), "--output", str(out), "-m", str(folder)]
    code, _, err = cli(
        capsys, "run", str(pipeline), *files, "--plugin", "tests.server_plugin", *args
    )
    assert code == 0, err
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return sorted(lines, key=lambda r: r["id"])


# -- a thinking model ----------------------------------------------------------------------


def test_chat_and_a_session_split_the_thought_alike(thinking) -> None:
    out = thinking.chat(QUESTION, logits_processors=SAYS, max_new_tokens=60)
    assert (out.text, out.reasoning_content) == ("hello", "plan")
    assert out.finish_reasons == ["eos"]

    session = thinking.chat_session(logits_processors=SAYS, max_new_tokens=60)
    assert "".join(session.send("hi?")) == "hello"
    assert session.messages[-1] == {
        "role": "assistant", "content": "hello", "reasoning_content": "plan"
    }  # fmt: skip
    assert session.finish_reason == "eos"
    deltas = list(session.send_deltas("again?"))
    thought = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content", "") for d in deltas)
    assert (content, thought) == ("hello", "plan")
    assert all(set(d) <= {"content", "reasoning_content"} for d in deltas)
    assert session.messages[-1]["reasoning_content"] == "plan"
    assert [m["role"] for m in session.messages] == ["user", "assistant"] * 2
    # the second turn answered what a fresh chat on its history answers
    fresh = thinking.chat(session.messages[:-1], logits_processors=SAYS, max_new_tokens=60)
    assert (fresh.text, fresh.reasoning_content) == ("hello", "plan")

    batch = thinking.chat_batch([QUESTION, QUESTION], logits_processors=SAYS, max_new_tokens=60)
    assert batch.send(["more?", "and?"]) == ["hello", "hello"]
    assert all(c[-1]["reasoning_content"] == "plan" for c in batch.conversations)


def test_a_session_stopped_in_its_thought_keeps_what_it_thought(thinking) -> None:
    """The caller stops at the first delta (a piece of the thought): the history keeps
    the thought read as far as it got, and no tag in the content."""
    session = thinking.chat_session(logits_processors=SAYS, max_new_tokens=60)
    deltas = session.send_deltas("hi?")
    first = next(deltas)
    deltas.close()
    assert "reasoning_content" in first
    last = session.messages[-1]
    assert last["role"] == "assistant" and "plan".startswith(last["reasoning_content"])
    assert "think>" not in (last["content"] or "")
    assert session.finish_reason is None


def test_ortgen_chat_streams_the_thought_to_stderr(thinking_folder, capsys) -> None:
    says = json.dumps(SAYS)
    common = ["-m", str(thinking_folder), "--plugin", "tests.server_plugin",
              "--max-new-tokens", "60", "--set", f"logits_processors={says}"]  # fmt: skip
    code, out, err = cli(capsys, "chat", "hi?", *common)
    assert code == 0, err
    assert out == "hello\n" and err == "thinking: plan\n"
    # thinking off: the template closes the thought, so the forced text is all answer
    code, out, err = cli(capsys, "chat", "hi?", *common, "--reasoning-effort", "none")
    assert code == 0, err
    assert "thinking" not in err and out.startswith("plan")


def test_an_ortgen_run_messages_row_splits_the_thought(thinking_folder, tmp_path, capsys) -> None:
    rows = [
        {"id": 1, "messages": QUESTION, "logits_processors": SAYS},
        {"id": 2, "prompt": "plain", "max_new_tokens": 3},  # in the same batch
        {"id": 3, "messages": QUESTION, "logits_processors": SAYS,
         "chat_template_kwargs": {"enable_thinking": False}, "max_new_tokens": 4},
    ]  # fmt: skip
    results = job(tmp_path, thinking_folder, rows, "--batch-size", "3", capsys=capsys)
    first, plain, off = results
    assert (first["text"], first["reasoning_content"]) == ("hello", "plan")
    assert first["finish_reason"] == "eos" and "<think>" not in first["text"]
    assert "reasoning_content" not in plain and "tool_calls" not in plain
    assert "reasoning_content" not in off and off["text"] == "plan"  # no thought


def test_a_thinking_row_parses_the_json_after_its_thought(thinking, tmp_path) -> None:
    """A thinking row under a JSON constraint: the constraint applies after the thought,
    and ``parsed`` is the content's JSON, as ``gen.chat`` reads it."""
    answer = 'plan\n</think>\n\n{"a":1}'
    rows = [{"id": 1, "messages": QUESTION, "logits_processors": [{"name": "says", "text": answer}],
             "response_format": {"type": "json_object"}}]  # fmt: skip
    source = tmp_path / "rows.jsonl"
    source.write_text(json.dumps(rows[0]) + "\n")
    run_job(thinking, source, tmp_path / "out.jsonl", settings={"max_new_tokens": 60},
            progress=None)  # fmt: skip
    [line] = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert line.get("parsed") == {"a": 1}, line
    assert (line["text"], line["reasoning_content"]) == ('{"a":1}', "plan")
    out = thinking.chat(QUESTION, response_format={"type": "json_object"}, max_new_tokens=60,
                        logits_processors=rows[0]["logits_processors"])  # fmt: skip
    assert (out.text, out.parsed) == (line["text"], line["parsed"])


# -- tool calls: a hermes template -------------------------------------------------------


def test_calls_are_read_alike_in_chat_a_session_and_a_job(hermes, tmp_path) -> None:
    settings = {"logits_processors": CALL_SAYS, "max_new_tokens": 60}
    out = hermes.chat(QUESTION, **TOOL_ROW, **settings)
    assert read_back(out.tool_calls) == CALL and out.finish_reasons == ["tool_calls"]

    session = hermes.chat_session(tools=TINY_TOOLS, tool_choice="required", **settings)
    deltas = list(session.send_deltas("hi?"))
    last = session.messages[-1]
    assert read_back(last["tool_calls"]) == CALL and session.finish_reason == "tool_calls"
    streamed = [c["id"] for d in deltas for c in d.get("tool_calls", ()) if "id" in c]
    assert streamed == [c["id"] for c in last["tool_calls"]]  # the ids the caller saw

    rows = [{"id": 1, "messages": QUESTION, **TOOL_ROW, "logits_processors": CALL_SAYS},
            {"id": 2, "messages": QUESTION, "max_new_tokens": 4}]  # fmt: skip
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for output in ("out.jsonl", "out.parquet"):
        run_job(hermes, source, tmp_path / output, settings={"max_new_tokens": 60},
                batch_size=2, progress=None)  # fmt: skip
    lines = {r["id"]: r for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert read_back(lines[1]["tool_calls"]) == CALL
    assert lines[1]["finish_reason"] == "tool_calls" and lines[1]["text"] == ""
    assert "tool_calls" not in lines[2]
    from ortgen.jobs.parquet import read_parquet_results

    table = {r["id"]: r for r in read_parquet_results(tmp_path / "out.parquet")}
    assert read_back(table[1]["tool_calls"]) == CALL and "tool_calls" not in table[2]


def test_a_chat_format_flag_changes_what_is_parsed(hermes_folder, capsys) -> None:
    """The same answer, a generic-format call: the hermes format reads it as text,
    ``--chat-format generic`` as a call."""
    text = json.dumps({"tool_calls": [{"name": "add", "arguments": {"a": 3}}]},
                      separators=(",", ":"))  # fmt: skip
    says = json.dumps([{"name": "says", "text": text}])
    common = ["-m", str(hermes_folder), "--plugin", "tests.server_plugin", "--max-new-tokens",
              "60", "--set", f"logits_processors={says}"]  # fmt: skip
    common += ["--tools", json.dumps(TINY_TOOLS)]
    code, out, err = cli(capsys, "chat", "hi?", *common)
    assert (code, out) == (0, text + "\n"), err
    code, out, err = cli(capsys, "chat", "hi?", *common, "--chat-format", "generic")
    assert code == 0, err
    [line] = out.splitlines()
    assert read_back([json.loads(line)]) == CALL


def test_a_job_checks_chat_options_before_it_runs(tmp_path) -> None:
    from ortgen.jobs import check_input

    rows = [
        {"prompt": "x", "tools": TINY_TOOLS},
        {"messages": QUESTION, "tools": "add"},
        {"messages": QUESTION, "response_format": {"type": "json_object"}, "regex": "a"},
        {"messages": QUESTION, "reasoning_effort": "none", "chat_template_kwargs": {"x": 1}},
    ]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = check_input(source)
    bad = dict(report.problems)
    assert sorted(bad) == ["line 1", "line 2", "line 3"], bad
    assert '"messages"' in bad["line 1"] and "not both" in bad["line 3"]
