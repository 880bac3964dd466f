"""The example plugin package, installed for real and found through its entry point.

``examples/ortgen-plugin-example`` is pip-installed into a temporary folder, and a
fresh interpreter with only that folder on ``PYTHONPATH`` must discover it the way
a user's install would: ``ortgen plugins --json`` lists its components under the
plugin name ``example`` (the entry-point name), and ``ortgen.load()`` (with no
``plugins=`` argument) can use them, with exactly the effect docs/plugins.md
describes; its chat format, found the same way, passes ``check_chat_format``. The
model is the tiny random llama (vocabulary 256, no tokenizer), so prompts are token ids
and decoding is greedy, which makes every effect exact.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ortgen-plugin-example"
PROMPTS = [[5, 6, 7], [9, 10, 11, 12]]
NEW_TOKENS = 16

# Runs in the subprocess: argv[1] is the model folder, argv[2] the prompts and length.
SCRIPT = r"""
import json, sys
import ortgen

folder = sys.argv[1]
prompts, new = json.loads(sys.argv[2])
gen = ortgen.load(folder)  # no plugins=: the example must come from its entry point


def run(**settings):
    out = gen.generate(prompts, max_new_tokens=new, **settings)
    return {"tokens": out.tokens, "reasons": out.finish_reasons}


def error(**settings):
    try:
        gen.generate(prompts, max_new_tokens=new, **settings)
    except ortgen.OrtgenError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


base = run()
first = [row[0] for row in base["tokens"]]  # each row's first greedy pick
stop = base["tokens"][0][3]                 # a token row 0 generates mid-way
result = {
    "plugins": sorted({e.plugin for k in ("logits_processor", "stopping_criterion")
                       for e in gen.registry.entries(k) if e.name in
                       ("ban_tokens", "seen_token_penalty", "stop_tokens")}),
    "base": base,
    "banned": first,
    "ban": run(logits_processors=[{"name": "ban_tokens", "token_ids": first}]),
    "seen": run(logits_processors=[{"name": "seen_token_penalty", "penalty": 1e4}]),
    "stop_token": stop,
    "stop": run(stopping_criteria=[{"name": "stop_tokens", "token_ids": [stop]}]),
    "bad_value": error(logits_processors=[{"name": "ban_tokens", "token_ids": [256]}]),
    "bad_param": error(logits_processors=[{"name": "ban_tokens", "tokens": [3]}]),
}
# the drafter (speculation runs one row) and the composed cache, through the library
one = [prompts[0]]
plain = gen.generate(one, max_new_tokens=new)
fast = gen.generate(one, max_new_tokens=new, drafter={"name": "repeat_token", "min_run": 1})
result["drafter"] = {"plain": plain.tokens, "fast": fast.tokens,
                     "drafted": fast.stats["drafted"], "kept": fast.stats["accepted"]}
result["capped"] = run(cache={"name": "capped_static", "max_positions": 64})
result["capped_refused"] = error(cache={"name": "capped_static", "max_positions": 8})
# a pipeline file selects the third-party component by name, and names the model
import pathlib, tempfile
toml = pathlib.Path(tempfile.mkdtemp()) / "ban.toml"
toml.write_text(
    f"model = {json.dumps(folder)}\n[generation]\nmax_new_tokens = {new}\n"
    f"[[logits_processors]]\nname = \"ban_tokens\"\ntoken_ids = {first}\n"
)
result["pipeline"] = ortgen.load(pipeline=toml).generate(prompts).tokens
disabled = ortgen.load(folder, disable_plugins=["example"])
result["disabled_names"] = disabled.registry.names("logits_processor")
print(json.dumps(result))
"""


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example package pip-installed (no deps, no index) into a fresh folder.

    It is built from a copy: an in-tree setuptools build would leave ``build/``
    and ``*.egg-info`` in the repository.
    """
    root = tmp_path_factory.mktemp("example-plugin")
    source, site = root / "src", root / "site"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "--target", str(site), str(source)],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (site / "ortgen_plugin_example" / "__init__.py").is_file()
    return site


def _run(site: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run(
        [sys.executable, *args], env=env, cwd=site.parent, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def results(plugin_site: Path, tiny_model_dirs) -> dict[str, Any]:
    onnx_dir = tiny_model_dirs["llama"][1]
    return json.loads(
        _run(plugin_site, "-c", SCRIPT, str(onnx_dir), json.dumps([PROMPTS, NEW_TOKENS]))
    )


def test_cli_lists_the_components_under_the_entry_point_name(plugin_site: Path) -> None:
    report = json.loads(_run(plugin_site, "-m", "ortgen.cli", "plugins", "--json"))
    ours = {
        (kind, e["name"]): (e["plugin"], e["parameters"])
        for kind, entries in report.items()
        if kind != "plugins"  # the plugins themselves, not components
        for e in entries
        if e["plugin"] == "example"
    }
    assert ours == {
        ("logits_processor", "ban_tokens"): ("example", ["token_ids"]),
        ("logits_processor", "seen_token_penalty"): ("example", ["penalty"]),
        ("stopping_criterion", "stop_tokens"): ("example", ["token_ids"]),
        ("drafter", "repeat_token"): ("example", ["num_tokens", "min_run"]),
        ("kv_cache", "capped_static"): ("example", ["max_positions"]),
        ("chat_format", "xml_calls"): ("example", []),
    }


def test_load_discovers_the_plugin_and_disable_blocks_it(results: dict[str, Any]) -> None:
    assert results["plugins"] == ["example"]
    names = results["disabled_names"]
    assert "ban_tokens" not in names and "seen_token_penalty" not in names
    assert "top_k" in names  # only the example was blocked


def test_ban_tokens_never_generates_the_banned_ids(results: dict[str, Any]) -> None:
    banned = set(results["banned"])
    base, ban = results["base"]["tokens"], results["ban"]["tokens"]
    assert all(row[0] in banned for row in base)  # they were generated without it
    assert all(not banned & set(row) for row in ban)
    assert all(len(row) == NEW_TOKENS for row in ban)
    assert results["ban"]["reasons"] == ["length", "length"]


def test_seen_token_penalty_stops_repeats(results: dict[str, Any]) -> None:
    base, penalised = results["base"]["tokens"], results["seen"]["tokens"]
    assert any(len(set(row)) < len(row) for row in base)  # greedy repeats without it
    assert all(len(set(row)) == len(row) for row in penalised)  # a 1e4 penalty forbids that
    for b, p in zip(base, penalised, strict=True):  # identical up to the first repeat
        repeat = next((i for i, t in enumerate(b) if t in b[:i]), len(b))
        assert p[:repeat] == b[:repeat]


def test_stop_tokens_ends_rows_with_its_finish_reason(results: dict[str, Any]) -> None:
    stop = results["stop_token"]
    for base, tokens, reason in zip(
        results["base"]["tokens"], results["stop"]["tokens"], results["stop"]["reasons"],
        strict=True,
    ):  # fmt: skip
        if stop in base:  # cut right after the stop token, which is kept
            assert tokens == base[: base.index(stop) + 1]
            assert reason == "stop_token"
        else:  # other rows are not affected
            assert tokens == base
            assert reason == "length"
    assert results["stop"]["reasons"][0] == "stop_token"


def test_bad_parameters_are_config_errors_naming_the_component(results: dict[str, Any]) -> None:
    assert results["bad_value"].startswith("ConfigError: ban_tokens: `token_ids`")
    assert "[0, 256)" in results["bad_value"]
    assert results["bad_param"] == (
        "ConfigError: logits_processor 'ban_tokens': unexpected 'tokens' (did you mean "
        "'token_ids'?); accepts token_ids; needs token_ids"
    )


def test_the_examples_drafter_and_cache_run_from_the_entry_point(results: dict[str, Any]) -> None:
    """Speculation is exact on this float32 model: the drafter changes no token, and it
    did draft; the composed cache gives the built-in's tokens and refuses past its cap."""
    drafter = results["drafter"]
    assert drafter["fast"] == drafter["plain"] and drafter["drafted"] > 0
    assert results["capped"] == results["base"]
    assert "max_positions" in (results["capped_refused"] or "")


def test_the_cli_runs_the_examples_drafter_and_cache(
    plugin_site: Path, tiny_model_dirs, tmp_path: Path
) -> None:
    """``ortgen bench`` (token-id prompts: the tiny model has no tokenizer) with the
    installed drafter and cache gives the greedy tokens it gives without them."""
    folder = str(tiny_model_dirs["llama"][1])
    ids = tmp_path / "prompt.json"
    ids.write_text(json.dumps(PROMPTS[0]))
    common = ["-m", "ortgen.cli", "bench", "-m", folder, "--threads", "1", "--no-quality", "--json",
              "--new-tokens", "12", "--prompt-ids", str(ids)]  # fmt: skip
    runs = {
        name: json.loads(_run(plugin_site, *common, *extra))
        for name, extra in {
            "plain": [],
            "drafter": ["--drafter", "repeat_token:min_run=1"],
            "cache": ["--cache", "capped_static:max_positions=64"],
        }.items()
    }
    assert runs["drafter"]["greedy_tokens"] == runs["plain"]["greedy_tokens"]
    assert runs["cache"]["greedy_tokens"] == runs["plain"]["greedy_tokens"]


def test_a_pipeline_file_selects_the_third_party_component(results: dict[str, Any]) -> None:
    assert results["pipeline"] == results["ban"]["tokens"]
    assert results["pipeline"] != results["base"]["tokens"]


SERVER_SCRIPT = r"""
import json, sys
import ortgen
from starlette.testclient import TestClient
from ortgen.serve.app import build_app
from ortgen.serve.engine import Engine
from ortgen.serve.model_pool import ModelPool, ServedModel
from ortgen.serve.state import ServerState

gen = ortgen.load(sys.argv[1], threads=1)  # the example comes from its entry point
engine = Engine(gen, max_batch=2, max_queue=4)
state = ServerState(ModelPool.single(ServedModel("tiny", gen, engine)))
body = {"model": "tiny", "prompt": "abcabcabc", "max_tokens": 12, "temperature": 0}
with TestClient(build_app(state)) as client:
    def ask(**extra):
        answer = client.post("/v1/completions", json={**body, **extra})
        return answer.status_code, answer.json()
    plain = ask()
    first = gen.tokenizer.encode(plain[1]["choices"][0]["text"], add_special_tokens=False)[0]
    print(json.dumps({
        "plain": plain,
        "drafter": ask(drafter={"name": "repeat_token", "min_run": 1}),
        "banned": first,
        "ban": ask(logits_processors=[{"name": "ban_tokens", "token_ids": [first]}]),
        "bad": ask(drafter={"name": "repeat_token", "min_run": 0}),
    }))
"""


def test_the_server_runs_the_examples_components(plugin_site: Path, tiny_text_model) -> None:
    """An OpenAI request to ``ortgen serve``'s app names the installed drafter and
    processor in its extra fields: the drafter changes no text (exact on this float32
    model), the processor bans what it is told, a bad parameter is a 400 naming it."""
    got = json.loads(_run(plugin_site, "-c", SERVER_SCRIPT, str(tiny_text_model)))
    status, plain = got["plain"]
    assert status == 200
    status, drafted = got["drafter"]
    assert status == 200
    assert drafted["choices"][0]["text"] == plain["choices"][0]["text"]
    status, banned = got["ban"]
    assert status == 200 and banned["choices"][0]["text"] != plain["choices"][0]["text"]
    status, bad = got["bad"]
    assert status == 400 and bad["error"]["param"] == "drafter", bad
    assert "min_run" in bad["error"]["message"]


FORMAT_SCRIPT = r"""
import json
from ortgen import CallDraft, ParsedAnswer
from ortgen.plugin_host.manager import build_registry, make_plugin_manager
from ortgen.testing import check_chat_format, make_tool_spec

entry = build_registry(make_plugin_manager()).get("chat_format", "xml_calls")
weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
now = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
call = '<call name="get_weather">{"city": "Paris"}</call>'
golden = [
    (call, ParsedAnswer("", [CallDraft("get_weather", '{"city": "Paris"}', True)])),
    ("Let me look.\n" + call + '\n<call name="now">{}</call>', ParsedAnswer(
        "Let me look.", [CallDraft("get_weather", '{"city": "Paris"}', True),
                         CallDraft("now", "{}", True)])),
    ("No <call needed.", ParsedAnswer("No <call needed.")),
    ('<call name="get_weather">{"city": "Pa', ParsedAnswer(
        "", [CallDraft("get_weather", '{"city": "Pa', False)])),
]
accepted = ['<call name="get_weather">{"city":"Paris"}</call>', "Text first.\n"
            '<call name="now">{}</call>\n<call name="get_weather">{"city":"x"}</call>']
report = check_chat_format(entry.factory(), golden, make_tool_spec([weather, now]),
                           grammar_accepts=accepted)
try:  # a misreading is caught: "Paris" is not "Oslo"
    oslo = ParsedAnswer("", [("get_weather", {"city": "Oslo"})])
    check_chat_format(entry.factory(), [(call, oslo)])
    caught = None
except AssertionError as exc:
    caught = str(exc)
print(json.dumps({"plugin": entry.plugin, "report": report, "caught": caught}))
"""


def test_the_examples_chat_format_passes_check_chat_format(plugin_site: Path) -> None:
    """The installed ``xml_calls`` format, found through the entry point, reads its
    answers whole and streamed, and its grammars compile (no model: cheap)."""
    got = json.loads(_run(plugin_site, "-c", FORMAT_SCRIPT))
    assert got["plugin"] == "example"
    assert got["report"]["golden 3"] == "whole and streamed in 38 prefixes"
    assert got["report"]["grammar_accepts"] == "accepted: 2"
    assert "call 0 is CallDraft(name='get_weather'" in got["caught"]


CHAT_SCRIPT = r"""
import json, sys
import ortgen

folder, pipeline = sys.argv[1], sys.argv[2]
gen = ortgen.load(folder, threads=1)
add = {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
       "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
ask = [{"role": "user", "content": "1+2?"}]
# the template thinks (<think>): a short budget, so the calls come within the limit
settings = dict(tools=[add], tool_choice="required", max_new_tokens=80, do_sample=True, seed=1,
                thinking_budget=2)
named = gen.chat(ask, chat_format="xml_calls", **settings)
piped = gen.chat(ask, pipeline=pipeline, **settings)
default = gen.chat(ask, **settings)
print(json.dumps({
    "named": [named.finish_reasons, named.tool_calls, named.tokens[0]],
    "piped": [piped.finish_reasons, piped.tool_calls, piped.tokens[0]],
    "default_text": gen.tokenizer.decode(default.tokens[0]),
    "named_text": gen.tokenizer.decode(named.tokens[0]),
}))
"""


@pytest.fixture(scope="module")
def hermes_family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.format_helpers import export_hermes_family

    return export_hermes_family(tmp_path_factory.mktemp("third-party-format"))


def test_a_third_party_chat_format_is_picked_by_name_everywhere(
    plugin_site: Path, hermes_family: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The installed ``xml_calls`` format, named in a library call, in a pipeline file's
    ``[generation]`` and in a server request's ``extra_body``, writes and reads its own
    calls (``<call name="add">...``) on a model whose template speaks hermes; unnamed,
    the same model answers in hermes."""
    pipeline = tmp_path / "xml.toml"
    pipeline.write_text('[generation]\nchat_format = "xml_calls"\n')
    got = json.loads(_run(plugin_site, "-c", CHAT_SCRIPT, str(hermes_family), str(pipeline)))
    for key in ("named", "piped"):
        reasons, calls, _ = got[key]
        assert reasons == ["tool_calls"], got
        assert [c["function"]["name"] for c in calls] == ["add"]
        assert isinstance(json.loads(calls[0]["function"]["arguments"])["a"], int)
    assert got["named"][2] == got["piped"][2]  # the same request, the same tokens
    assert '<call name="add">' in got["named_text"]
    assert "<tool_call>" in got["default_text"]
    from tests.server_helpers import ServerProcess

    monkeypatch.setenv("PYTHONPATH", str(plugin_site))
    server = ServerProcess("--model", str(hermes_family), "--threads", "1").ready()
    try:
        answer = server.client().chat.completions.create(
            model="x", messages=[{"role": "user", "content": "1+2?"}], max_tokens=80,
            tools=[{"type": "function", "function": {"name": "add", "parameters": {
                "type": "object", "properties": {"a": {"type": "integer"}},
                "required": ["a"]}}}],
            tool_choice="required", seed=1, temperature=1.0,
            extra_body={"chat_format": "xml_calls", "thinking_budget": 2},
        )  # fmt: skip
    finally:
        server.stop()
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.function.name for c in choice.message.tool_calls] == ["add"]
