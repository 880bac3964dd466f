"""The structured-output flags of ``ortgen generate`` and ``ortgen chat``: ``--json-schema``,
``--json-object``, ``--regex``, ``--grammar`` and ``--choice`` give what the API gives
with the settings of the same names, and every bad flag is a status-2 error that names
the problem (a broken constraint before the model loads).

In-process (``main``, output read with capsys) on a tiny random Llama with a character
tokenizer, where only the constraint keeps the output in shape; one subprocess checks
the installed command's status and error line.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

import ortgen
from ortgen.cli import main

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
PAIR = 'start: "(" NUM "," NUM ")"\nNUM: /[0-9]{1,2}/\n'


@pytest.fixture(scope="module")
def gen(tiny_text_model: Path):
    return ortgen.load(tiny_text_model, threads=1)


@pytest.fixture
def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "person.json"
    path.write_text(json.dumps(PERSON), encoding="utf-8")
    return path


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """(status, stdout, stderr) of ``ortgen ARGS`` run in this process."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_regex(tiny_text_model, gen, capsys) -> None:
    regex = r"[0-9]{3}-[a-c]{2}"
    code, out, err = cli(capsys, "generate", "Phone", "-m", str(tiny_text_model), "--regex", regex)
    assert (code, err) == (0, "")
    assert re.fullmatch(regex, out.removesuffix("\n")), out
    assert out == gen.generate("Phone", regex=regex).text + "\n"


def test_chat_choice(tiny_text_model, gen, capsys) -> None:
    choices = ["red", "green", "blue sky"]
    args = ["chat", "Pick one.", "-m", str(tiny_text_model)]
    code, out, _ = cli(capsys, *args, *(arg for c in choices for arg in ("--choice", c)))
    assert code == 0 and out.removesuffix("\n") in choices
    messages = [{"role": "user", "content": "Pick one."}]
    assert out == gen.chat(messages, choice=choices).text + "\n"


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_json_schema_file_and_inline_text(tiny_text_model, gen, schema_file, capsys, command):
    """The file and the same schema inline give the same answer, valid against it."""
    base = [command, "Maria, 34", "-m", str(tiny_text_model), "--max-new-tokens", "60"]
    code, from_file, err = cli(capsys, *base, "--json-schema", str(schema_file))
    assert (code, err) == (0, "")
    answer = json.loads(from_file)
    jsonschema.validate(answer, PERSON)
    code, inline, _ = cli(capsys, *base, "--json-schema", json.dumps(PERSON))
    assert code == 0 and inline == from_file
    if command == "generate":
        assert answer == gen.generate("Maria, 34", json_schema=PERSON, max_new_tokens=60).parsed


def test_json_object_and_grammar(tiny_text_model, tmp_path, capsys) -> None:
    base = ["generate", "Go", "-m", str(tiny_text_model), "--max-new-tokens", "60"]
    code, out, _ = cli(capsys, *base, "--json-object")
    assert code == 0 and isinstance(json.loads(out), dict)
    lark = tmp_path / "pair.lark"
    lark.write_text(PAIR, encoding="utf-8")
    for seed in ("1", "2"):
        code, out, _ = cli(capsys, *base, "--grammar", str(lark), "--do-sample", "--seed", seed)
        assert code == 0 and re.fullmatch(r"\(\d{1,2},\d{1,2}\)\n", out), out


def test_flags_take_the_path_of_set(tiny_text_model, schema_file, capsys) -> None:
    """A flag is a setting of the call layer: ``config show`` says so, and ``--set`` of
    the same setting comes after it and wins."""
    code, out, _ = cli(
        capsys, "config", "show", "-m", str(tiny_text_model), "--json",
        "--json-schema", str(schema_file),
    )  # fmt: skip
    assert code == 0
    assert json.loads(out)["json_schema"] == {"value": PERSON, "set_by": "call"}
    args = ["generate", "Hi", "-m", str(tiny_text_model), "--regex", "[a-z]+"]
    code, out, _ = cli(capsys, *args, "--set", "regex=[0-9]{4}")
    assert code == 0 and re.fullmatch(r"[0-9]{4}\n", out), out


def test_json_cut_short_prints_the_text_and_says_why(tiny_text_model, schema_file, capsys):
    args = ["chat", "Maria, 34", "-m", str(tiny_text_model), "--max-new-tokens", "5"]
    code, out, err = cli(capsys, *args, "--json-schema", str(schema_file))
    assert code == 0 and out == '{"nam\n'
    assert err == (
        "ortgen: warning: the output is not whole JSON: it stopped at max_new_tokens before "
        "the JSON was complete (raise --max-new-tokens)\n"
    )


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--grammar", "{dir}/nope.lark"], "--grammar {dir}/nope.lark: no such file"),
        (["--grammar", "{dir}"], "--grammar {dir}: cannot read it: [Errno 21] Is a directory"),
        (["--json-schema", "{dir}/nope.json"], "--json-schema {dir}/nope.json: no such file"),
        (["--json-schema", "{dir}/list.json"], "holds a JSON list; a JSON Schema is an object"),
        (["--json-schema", "{dir}/bad.json"], "--json-schema {dir}/bad.json: the file is not JSON"),
        (["--json-schema", '{"type": '], "json_schema must be a JSON Schema, but JSON text is"),
        (["--json-schema", '{"type": "strin"}'], "json_schema: llguidance cannot compile this"),
        (["--grammar", "{dir}/bad.lark"], "grammar: llguidance cannot compile this Lark grammar"),
        (["--choice", ""], "choice must be a non-empty list of non-empty strings"),
    ],
)
def test_bad_flags_are_named_before_the_model_loads(tmp_path, capsys, flags, message) -> None:
    """``-m`` points nowhere: the flag's problem is found first, without a model."""
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "bad.json").write_text("{oops")
    (tmp_path / "bad.lark").write_text("start: (")
    flags = [flag.replace("{dir}", str(tmp_path)) for flag in flags]
    code, out, err = cli(capsys, "chat", "Hi", "-m", str(tmp_path / "no-model"), *flags)
    assert code == 2 and out == ""
    assert err.startswith("ortgen: error: "), err
    assert message.replace("{dir}", str(tmp_path)) in err, err


def test_bad_regex_exits_2_naming_regex() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ortgen.cli", "generate", "Hi", "--regex", "[0-9"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(
        "ortgen: error: regex: llguidance cannot compile this regular expression: "
    ), result.stderr
    assert "unclosed character class" in result.stderr


def test_two_constraints_are_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["generate", "Hi", "--regex", "a+", "--choice", "b"])
    assert exited.value.code == 2
    assert "argument --choice: not allowed with argument --regex" in capsys.readouterr().err
