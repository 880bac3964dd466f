"""The code in the docs runs: the README tour and the plugin tutorial (docs/plugins.md),
on the default model, and docs/server.md's client snippets against a live server of it,
so a renamed API or a changed output breaks the build, not a user.

- ```python blocks are executed (a tutorial's blocks in order, in one namespace, as a
  reader would paste them); blocks of ``>>>`` lines are run as doctests with ELLIPSIS
  (``...`` in an expected output stands for any text).
- ```sh lines that call ``ortgen`` are parsed with the real argument parser, so a renamed
  subcommand or flag fails (they are not run: generation is tested in test_cli.py).
- A block right after a line ``<!-- not-run: REASON -->`` is skipped.
- The placeholder model path ``"path/to/model"`` is replaced by the default model's folder.
"""

from __future__ import annotations

import doctest
import functools
import re
import shlex
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

import ortgen
from ortgen.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(.+?)\s*-->$")
PLACEHOLDER_MODEL = '"path/to/model"'


@dataclass
class Block:
    lang: str
    code: str
    line: int  # of the opening fence, 1-based
    section: str  # the nearest heading above it
    not_run: str | None  # the reason, when marked


def blocks(name: str) -> list[Block]:
    """Every fenced code block of a markdown file, with its heading and marker."""
    lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    section, i = "", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            previous = next(
                (lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), ""
            )
            marker = NOT_RUN.match(previous)
            code = "\n".join(lines[i + 1 : end]) + "\n"
            found.append(Block(fence.group(1), code, i + 1, section, marker and marker.group(1)))
            i = end
        i += 1
    return found


def section_blocks(name: str, first: str, last: str | None = None) -> list[Block]:
    """Blocks from the heading ``first`` up to (not including) the heading ``last``."""
    all_blocks, out, inside = blocks(name), [], False
    text = (ROOT / name).read_text(encoding="utf-8")
    headings = [h.lstrip("#").strip() for h in re.findall(r"^#+ .+$", text, re.M)]
    assert first in headings, f"{name} has no heading {first!r}"
    order = {h: n for n, h in enumerate(headings)}
    for block in all_blocks:
        rank = order[block.section]
        inside = rank >= order[first] and (last is None or rank < order[last])
        if inside:
            out.append(block)
    return out


def where(name: str, block: Block) -> str:
    return f"{name}:{block.line} ({block.section})"


def run_python(name: str, block: Block, namespace: dict, model: Path) -> None:
    code = block.code.replace(PLACEHOLDER_MODEL, repr(str(model)))
    exec(compile(code, where(name, block), "exec"), namespace)


def run_doctest(name: str, block: Block, globs: dict) -> None:
    parser = doctest.DocTestParser()
    test = parser.get_doctest(block.code, globs, where(name, block), name, block.line)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    runner = doctest.DocTestRunner(optionflags=flags)
    failures: list[str] = []
    runner.run(test, out=failures.append, clear_globs=False)
    assert runner.failures == 0, "".join(failures)


def as_module(name: str, namespace: dict) -> types.ModuleType:
    """The namespace the blocks filled, as the plugin module they describe."""
    module = types.ModuleType(name)
    module.__dict__.update({k: v for k, v in namespace.items() if k != "__builtins__"})
    return module


# --------------------------------------------------------------------------- README


@pytest.mark.default_model
def test_readme_tour_runs(default_model_dir, capsys):
    tour = [b for b in section_blocks("README.md", "A short tour") if b.lang == "python"]
    assert len(tour) == 2, [where("README.md", b) for b in tour]
    block = tour[0]
    assert block.not_run is None, "the tour itself must run"
    namespace: dict = {}
    run_python("README.md", block, namespace, default_model_dir)
    # what the tour's comments promise
    out, gen, chat = namespace["out"], namespace["gen"], namespace["chat"]
    assert isinstance(gen, ortgen.TextGenerator) and gen.path.resolve() == default_model_dir
    assert isinstance(out.text, str) and out.text
    assert isinstance(out.tokens, list) and len(out.tokens) == 1 and len(out.tokens[0]) == 16
    assert out.finish_reasons == ["length"]
    printed = capsys.readouterr().out
    assert printed.strip(), "stream() and chat.send() printed nothing"
    assert chat.reused_tokens > 0  # the second send() went through the cache
    assert [m["role"] for m in chat.messages] == ["user", "assistant"] * 2


@pytest.mark.default_model
def test_readme_plugin_example_runs_and_bans_its_token(default_model_dir):
    block = [b for b in section_blocks("README.md", "A short tour") if b.lang == "python"][1]
    namespace: dict = {"__name__": "readme_plugin"}
    run_python("README.md", block, namespace, default_model_dir)
    plugin = as_module("readme_plugin", namespace)
    gen = ortgen.load(default_model_dir, plugins=[plugin])
    prompt = "The capital of France is"
    free = gen.generate(prompt, max_new_tokens=8)
    token = free.tokens[0][1]
    banned = gen.generate(
        prompt, max_new_tokens=8, logits_processors=[{"name": "ban_token", "token": token}]
    )
    assert token not in banned.tokens[0] and banned.tokens != free.tokens
    # the call the README shows, verbatim
    out = gen.generate(
        prompt, max_new_tokens=8, logits_processors=[{"name": "ban_token", "token": 42}]
    )
    assert 42 not in out.tokens[0]


def shell_commands(name: str) -> list[tuple[str, list[str]]]:
    """(location, argv) of every `ortgen ...` line in the file's sh/console blocks."""
    found = []
    for block in blocks(name):
        if block.lang not in ("sh", "bash", "") or block.not_run:
            continue
        text = block.code.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("ortgen "):
                argv = shlex.split(line, comments=True)
                if "|" in argv:
                    argv = argv[: argv.index("|")]
                found.append((where(name, block), argv[1:]))
    return found


def is_synopsis(argv: list[str]) -> bool:
    """Usage lines (``ortgen generate PROMPT [...]``) are placeholders, not commands."""
    return any(a.startswith("[") or a.isupper() for a in argv)


COMMANDS = [
    pytest.param(argv, id=f"{loc}: ortgen {' '.join(argv)}"[:90])
    for name in ("README.md", "docs/cli.md", "docs/plugins.md", "docs/config.md")
    for loc, argv in shell_commands(name)
    if not is_synopsis(argv)
]


@pytest.mark.parametrize("argv", COMMANDS)
def test_documented_commands_parse(argv):
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0:  # --help
            return
        pytest.fail(f"`ortgen {' '.join(argv)}` is not accepted by the parser (status {exc})")


def test_some_commands_were_found():
    assert len(COMMANDS) >= 20


# --------------------------------------------------------------------------- plugin tutorial

TUTORIAL = "Tutorial: building ortgen-plugin-example"


def tutorial() -> list[Block]:
    return [b for b in section_blocks("docs/plugins.md", TUTORIAL) if b.lang == "python"]


@pytest.fixture(scope="module")
def tutorial_plugin(default_model_dir) -> types.ModuleType:
    """The tutorial's code blocks, executed in order: the plugin module they build."""
    import sys

    example = str(ROOT / "examples" / "ortgen-plugin-example")
    sys.path.insert(0, example)  # step 8 imports the finished package
    try:
        namespace: dict = {"__name__": "ortgen_plugin_tutorial"}
        for block in tutorial():
            if block.not_run is None and not block.code.lstrip().startswith(">>>"):
                run_python("docs/plugins.md", block, namespace, default_model_dir)
    finally:
        sys.path.remove(example)
    return as_module("ortgen_plugin_tutorial", namespace)


@pytest.mark.default_model
def test_tutorial_has_code(tutorial_plugin):
    kinds = {"ban_tokens", "seen_token_penalty", "stop_tokens", "gumbel", "numpy"}
    defined = {"BanTokens", "SeenTokenPenalty", "StopTokens", "GumbelSampler", "NumpyCache"}
    assert defined <= set(vars(tutorial_plugin)), "a tutorial step's class is missing"
    registered = set()
    for hook in (
        "register_logits_processors", "register_samplers", "register_stopping_criteria",
        "register_kv_caches",
    ):  # fmt: skip
        getattr(tutorial_plugin, hook)(lambda name, factory, **kw: registered.add(name))
    assert registered == kinds


@pytest.mark.default_model
def test_tutorial_doctests_pass(tutorial_plugin, default_model_dir):
    """Step 10's session, with the tutorial's plugin registered as if installed (step 9)."""
    installed = types.SimpleNamespace(
        **{k: getattr(ortgen, k) for k in ("ConfigError", "ComponentError", "GenerationOutput")},
        load=functools.partial(ortgen.load, plugins=[tutorial_plugin]),
    )
    doctests = [b for b in tutorial() if b.code.lstrip().startswith(">>>") and not b.not_run]
    assert doctests, "the tutorial has no >>> session"
    globs = {"ortgen": installed}
    for block in doctests:
        run_doctest("docs/plugins.md", block, globs)


@pytest.mark.default_model
def test_tutorial_components_do_what_the_comments_say(tutorial_plugin, default_model_dir):
    gen = ortgen.load(default_model_dir, plugins=[tutorial_plugin])
    prompt, settings = "Once upon a time", dict(max_new_tokens=12)
    reference = gen.generate(prompt, **settings)
    # "use: gen.generate(..., cache="numpy")": the same tokens as the built-in cache
    assert gen.generate(prompt, cache="numpy", **settings).tokens == reference.tokens
    # "use: gen.generate(..., do_sample=True, sampler="gumbel", seed=1)": seeded, repeatable
    sampled = [
        gen.generate(prompt, do_sample=True, sampler="gumbel", seed=1, **settings).tokens
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]
    banned_id = reference.tokens[0][0]
    banned = gen.generate(
        prompt, logits_processors=[{"name": "ban_tokens", "token_ids": [banned_id]}], **settings
    )
    assert banned_id not in banned.tokens[0]
    stop = reference.tokens[0][4]
    stopped = gen.generate(
        prompt, stopping_criteria=[{"name": "stop_tokens", "token_ids": [stop]}], **settings
    )
    assert stopped.finish_reasons == ["stop_token"]
    assert stopped.tokens[0] == reference.tokens[0][: reference.tokens[0].index(stop) + 1]
    with pytest.raises(ortgen.ConfigError, match="ban_tokens: `token_ids`"):
        gen.generate(prompt, logits_processors=[{"name": "ban_tokens", "token_ids": [10**9]}])


# --------------------------------------------------------------------------- pipelines

PIPELINES = "docs/pipelines.md"


@pytest.mark.default_model
def test_the_sample_pipeline_file_generates(default_model_dir, tmp_path, capsys):
    """docs/pipelines.md's pipeline file as written (its model line pointed at the default
    model's folder), beside the schema file it names (the page's own person schema): `ortgen
    run` answers every row with the JSON it asks for. With its `top_k` given in
    `[[logits_processors]]` it ran before the constraint and every row failed."""
    import json
    import tomllib

    from ortgen.cli import main

    page = blocks(PIPELINES)
    [sample] = [b for b in page if b.section == "A pipeline file" and b.lang == "toml"]
    model = f'model = "{default_model_dir}"'
    text = re.sub(r'^model = "[^"]*"', model, sample.code, count=1, flags=re.M)
    assert text != sample.code and 'json_schema = "person.json"' in text
    [table] = [b for b in page if b.lang == "toml" and "[output.json_schema]" in b.code]
    schema = tomllib.loads(table.code)["output"]["json_schema"]
    (tmp_path / "my.toml").write_text(text, encoding="utf-8")
    (tmp_path / "person.json").write_text(json.dumps(schema), encoding="utf-8")
    rows = [
        {"id": "q1", "prompt": "Maria is 34 and lives in Lisbon.", "seed": 1},
        {"id": "q2", "messages": [{"role": "user", "content": "Joe is 5."}], "seed": 2},
        {"id": "q3", "prompt": "The capital of France is", "seed": 3},
    ]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "results.jsonl"
    args = ["run", str(tmp_path / "my.toml"), "--input", str(source), "--output", str(out)]
    assert main([*args, "--dry-run"]) == 0
    assert "warning" not in capsys.readouterr().out
    assert main([*args, "--threads", "2"]) == 0, capsys.readouterr().err
    assert "3 rows ok, 0 errors" in capsys.readouterr().err
    for line in map(json.loads, out.read_text(encoding="utf-8").splitlines()):
        person = line["parsed"]
        assert set(person) == {"name", "age"} and isinstance(person["age"], int), line


def test_the_documented_errors_are_what_the_pipeline_gives(tmp_path, monkeypatch):
    """The page's file with several problems reports every one of them, in one error, as
    the page shows it (a [generation] typo hides none of the others)."""
    section = [b for b in blocks(PIPELINES) if b.section == "Errors"]
    [toml] = [b for b in section if b.lang == "toml"]
    [shown] = [b for b in section if b.code.startswith("ortgen: error: invalid pipeline")]
    monkeypatch.chdir(tmp_path)
    Path("my.toml").write_text(toml.code, encoding="utf-8")
    with pytest.raises(ortgen.ConfigError) as caught:
        ortgen.load(pipeline="my.toml")
    assert f"ortgen: error: {caught.value}\n" == shown.code
    fields = [field for field, _ in caught.value.problems]
    assert fields == ["generation.tempreature", "logits_processors[1]", "run.engine"]


# --------------------------------------------------------------------------- server clients

SERVER = "docs/server.md"
DOCS_URL = "http://127.0.0.1:8000"


@pytest.mark.default_model
def test_the_clients_section_runs_against_a_server(default_model_dir, pytestconfig, capsys):
    """docs/server.md's "Clients" snippets, in order, in one namespace (as a reader pastes
    them), against a live server of the default model; instructor's in its own venv
    (tests/client_venvs.py), as the page says to install it. Each gives what its
    comments promise."""
    import dataclasses
    import json
    import subprocess

    from pydantic import BaseModel

    from tests.client_venvs import instructor_python
    from tests.server_helpers import ServerProcess

    python = [b for b in section_blocks(SERVER, "Clients", "Requests") if b.lang == "python"]
    assert [b.section for b in python] == [
        "openai", "langchain-openai", "pydantic-ai", "openai-agents", "instructor",
    ]  # fmt: skip
    server = ServerProcess("--model", str(default_model_dir), "--threads", "1").ready()
    try:
        namespace: dict = {}
        for block in python[:4]:
            pointed = dataclasses.replace(block, code=block.code.replace(DOCS_URL, server.url))
            run_python(SERVER, pointed, namespace, default_model_dir)
        instructor = python[4].code.replace(DOCS_URL, server.url)
        venv = instructor_python(pytestconfig.cache.mkdir("client-venvs"))
        done = subprocess.run(
            [str(venv), "-c", instructor], capture_output=True, text=True, timeout=600
        )
    finally:
        server.stop()
    city = namespace["City"]
    assert issubclass(city, BaseModel)
    assert isinstance(namespace["city"], city) and isinstance(namespace["agents_city"], city)
    assert namespace["call"]["name"] == "add" and set(namespace["call"]["args"]) == {"a", "b"}
    assert namespace["answer"].content.strip() and not namespace["answer"].tool_calls
    run = namespace["run"]  # pydantic-ai: multiply called once, its result read back
    returns = [
        p.content for m in run.all_messages() for p in m.parts if p.part_kind == "tool-return"
    ]
    assert len(returns) == 1 and isinstance(returns[0], int) and run.output.strip()
    assert (
        len(namespace["used"]) == 1
        and namespace["final"].text.strip()
        and namespace["text"].strip()
    )
    assert done.returncode == 0, done.stderr
    city.model_validate(json.loads(done.stdout.splitlines()[-1]))
    assert capsys.readouterr().out.count("\n") >= 4  # the snippets' prints
