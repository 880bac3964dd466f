"""The plugin contract: registration, duplicates, disabling, and failing components."""

from __future__ import annotations

import numpy as np
import pytest

import ortgen
from ortgen import hookimpl
from ortgen.plugin_host.manager import build_registry, make_plugin_manager
from ortgen.plugins import BUILTIN_PLUGINS


class Plugin:
    """A third-party plugin defined in a test: a processor that bans one token."""

    @hookimpl
    def register_logits_processors(self, register):
        register("ban", Ban)
        register("broken", Broken)
        register("bad_shape", lambda: lambda ids, scores: scores[:, :-1])
        register("nan", lambda: lambda ids, scores: np.full_like(scores, np.nan))
        register("some_nan", lambda: lambda ids, scores: np.where(scores > 0, np.nan, scores))

    @hookimpl
    def register_stopping_criteria(self, register):
        register("after_three", AfterThree)


class Ban:
    def __init__(self, token: int, *, ctx: ortgen.GenerationContext) -> None:
        self.token = token
        self.vocab = ctx.vocab_size

    def __call__(self, input_ids, scores):
        out = scores.copy()
        out[:, self.token] = -np.inf
        return out


class Broken:
    def __call__(self, input_ids, scores):
        raise RuntimeError("boom")


class AfterThree:
    finish_reason = "three"

    def __init__(self, *, ctx):
        self.start = ctx.prompt_length

    def __call__(self, input_ids, scores):
        return np.full(input_ids.shape[0], input_ids.shape[1] - self.start >= 3)


@pytest.fixture(scope="module")
def llama_dir(tiny_model_dirs):
    return tiny_model_dirs["llama"][1]


def test_builtins_register_like_any_plugin():
    registry = build_registry(make_plugin_manager(load_entry_points=False))
    for kind, names in {
        "logits_processor": {"temperature", "top_k", "top_p"},
        "sampler": {"greedy", "multinomial"},
        "stopping_criterion": {"eos", "max_length"},
        "kv_cache": {"dynamic"},
    }.items():
        assert names <= set(registry.names(kind))
        assert {e.plugin for e in registry.entries(kind)} <= set(BUILTIN_PLUGINS)


def test_duplicate_name_is_an_error_naming_both():
    class Dup:
        @hookimpl
        def register_samplers(self, register):
            register("greedy", lambda: None)

    pm = make_plugin_manager(load_entry_points=False, extra=[Dup()])
    with pytest.raises(ortgen.PluginError, match=r"'greedy' is registered twice.*samplers"):
        build_registry(pm)


def test_replace_true_overrides():
    class Override:
        @hookimpl
        def register_samplers(self, register):
            register("greedy", lambda: None, replace=True)

    registry = build_registry(make_plugin_manager(load_entry_points=False, extra=[Override()]))
    assert registry.get("sampler", "greedy").plugin != "ortgen.plugins.samplers"


def test_disable_blocks_a_builtin():
    pm = make_plugin_manager(load_entry_points=False, disable=["ortgen.plugins.processors"])
    registry = build_registry(pm)
    assert "top_k" not in registry.names("logits_processor")
    with pytest.raises(ortgen.ConfigError, match="unknown logits_processor 'top_k'"):
        registry.get("logits_processor", "top_k")


def test_explicit_processor_from_config_changes_output(llama_dir):
    gen = ortgen.load(llama_dir, plugins=[Plugin()])
    prompt = [5, 17, 42]
    plain = gen.generate(prompt, max_new_tokens=4, eos_token_id=None).tokens[0]
    banned = plain[0]
    out = gen.generate(
        prompt,
        max_new_tokens=4,
        eos_token_id=None,
        logits_processors=[{"name": "ban", "token": banned}],
    )
    assert banned not in out.tokens[0]


def test_explicit_stopping_criterion_reports_its_reason(llama_dir):
    gen = ortgen.load(llama_dir, plugins=[Plugin()])
    out = gen.generate(
        [5, 17], max_new_tokens=10, eos_token_id=None, stopping_criteria=["after_three"]
    )
    assert len(out.tokens[0]) == 3 and out.finish_reasons == ["three"]


def test_unknown_parameter_is_named(llama_dir):
    gen = ortgen.load(llama_dir, plugins=[Plugin()])
    message = r"logits_processor 'ban': unexpected 'tokn' \(did you mean 'token'\?\); accepts"
    with pytest.raises(ortgen.ConfigError, match=message):
        gen.generate([5], max_new_tokens=2, logits_processors=[{"name": "ban", "tokn": 1}])


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("broken", r"'broken' failed at step 0: RuntimeError: boom"),
        ("bad_shape", r"'bad_shape' returned"),
        ("nan", r"NaN everywhere at step 0 after nan"),
        ("some_nan", r"NaN in places at step 0 after some_nan; a logits processor must"),
    ],
)
def test_failing_component_is_named_and_request_fails_cleanly(llama_dir, name, message):
    gen = ortgen.load(llama_dir, plugins=[Plugin()])
    with pytest.raises(ortgen.ComponentError, match=message):
        gen.generate([5, 17], max_new_tokens=3, logits_processors=[name])
    # the generator is unaffected: the next request works
    assert len(gen.generate([5, 17], max_new_tokens=3, eos_token_id=None).tokens[0]) == 3


def test_partial_output_is_kept_when_a_component_fails_mid_request(llama_dir):
    class FailLater:
        def __init__(self):
            self.calls = 0

        def __call__(self, ids, scores):
            self.calls += 1
            if self.calls == 3:
                raise ValueError("third call")
            return scores

    class P:
        @hookimpl
        def register_logits_processors(self, register):
            register("fail_later", FailLater)

    gen = ortgen.load(llama_dir, plugins=[P()])
    with pytest.raises(ortgen.ComponentError) as info:
        gen.generate([5, 17], max_new_tokens=8, eos_token_id=None, logits_processors=["fail_later"])
    partial = info.value.partial
    assert len(partial.tokens[0]) == 2 and partial.finish_reasons == ["error"]


def test_misspelled_hook_is_an_error():
    class Typo:
        @hookimpl
        def register_sampler(self, register):  # missing the final "s"
            register("x", lambda: None)

    with pytest.raises(ortgen.PluginError, match="register_sampler"):
        make_plugin_manager(load_entry_points=False, extra=[Typo()])


def test_in_process_plugins_are_named_by_class():
    class Dup:
        @hookimpl
        def register_samplers(self, register):
            register("greedy", lambda: None)

    pm = make_plugin_manager(load_entry_points=False, extra=[Dup()])
    with pytest.raises(ortgen.PluginError, match=r"test_plugins\..*Dup"):
        build_registry(pm)


def test_failing_cache_is_named(llama_dir):
    class BadCache:
        def __init__(self, *, ctx):
            pass

        def inputs(self):
            raise KeyError("lost")

    class P:
        @hookimpl
        def register_kv_caches(self, register):
            register("bad", BadCache)

    gen = ortgen.load(llama_dir, plugins=[P()])
    with pytest.raises(
        ortgen.ComponentError, match=r"kv cache 'bad' failed in inputs\(\) at step 0"
    ):
        gen.generate([5, 17], max_new_tokens=3, cache="bad")


def test_components_take_parameters_from_tables(llama_dir):
    class Fixed:
        def __init__(self, token: int):
            self.token = token

        def __call__(self, ids, scores):
            return np.full(ids.shape[0], self.token, dtype=np.int64)

    class P:
        @hookimpl
        def register_samplers(self, register):
            register("fixed", Fixed)

    gen = ortgen.load(llama_dir, plugins=[P()])
    out = gen.generate(
        [5], max_new_tokens=3, eos_token_id=None, sampler={"name": "fixed", "token": 7}
    )
    assert out.tokens == [[7, 7, 7]]


def _dist_info(site, name: str, entry_points: str | None) -> None:
    folder = site / f"{name}-1.0.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    if entry_points is not None:
        (folder / "entry_points.txt").write_text(entry_points)


def test_the_entry_point_pre_scan_never_misses_a_plugin(tmp_path, monkeypatch):
    """The pre-scan that spares a cold start importlib.metadata (~0.09 s) when no plugin
    package is installed may say "maybe" wrongly, never "none" wrongly: checked against
    importlib.metadata itself on the same sys.path."""
    import importlib.metadata

    from ortgen.plugin_host.manager import ENTRY_POINT_GROUP
    from ortgen.plugin_host.sources import entry_points_may_exist as _entry_points_may_exist

    site = tmp_path / "site"
    _dist_info(site, "no_entry_points", None)
    _dist_info(site, "other_group", "[console_scripts]\nx = y:z\n")
    monkeypatch.setattr("sys.path", [str(site), str(tmp_path / "missing")])

    def found() -> list[str]:
        return [ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]

    assert found() == [] and not _entry_points_may_exist(ENTRY_POINT_GROUP)
    _dist_info(site, "a_plugin", "[console_scripts]\nx = y:z\n\n[ortgen]\nmine = my_pkg\n")
    assert found() == ["mine"] and _entry_points_may_exist(ENTRY_POINT_GROUP)
    archive = tmp_path / "plugins.zip"  # a zip on sys.path: only the full loader reads it
    archive.write_bytes(b"PK\x05\x06" + bytes(18))
    monkeypatch.setattr("sys.path", [str(archive)])
    assert _entry_points_may_exist(ENTRY_POINT_GROUP)
    egg = tmp_path / "old_plugin-1.0.egg"  # a folder egg keeps its metadata in EGG-INFO
    (egg / "EGG-INFO").mkdir(parents=True)
    (egg / "EGG-INFO" / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: old_plugin\n")
    (egg / "EGG-INFO" / "entry_points.txt").write_text("[ortgen]\nold = old_plugin\n")
    monkeypatch.setattr("sys.path", [str(egg)])
    assert found() == ["old"] and _entry_points_may_exist(ENTRY_POINT_GROUP)


def test_no_plugin_package_means_no_importlib_metadata_import():
    """What the pre-scan is for, seen from a fresh interpreter."""
    import subprocess
    import sys

    code = (
        "import sys; from ortgen.plugin_host.manager import build_registry, make_plugin_manager; "
        "build_registry(make_plugin_manager()); print('importlib.metadata' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
