"""Plugins that fail alone (issue 38), in-process: what ``make_plugin_manager`` and
``build_registry`` do with installed plugins that fail, with a plugin registered twice,
with ``$ORTGEN_DISABLE_PLUGINS``, and what ``--plugin`` imports.

Installed plugins are real: a folder holding each package and its ``*.dist-info``
(``tests/plugin_sites.py``), put on ``sys.path`` for the test. The same through the
``ortgen`` command is in ``tests/test_plugin_cli.py``.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import ortgen
from ortgen import hookimpl
from ortgen.plugin_host.manager import (
    BrokenPluginWarning,
    build_registry,
    import_plugin,
    make_plugin_manager,
)
from tests.plugin_sites import BROKEN, FORCE, HOOK_FAILS, add_module, add_plugin, forget_modules


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("ORTGEN_DISABLE_PLUGINS", raising=False)
    forget_modules()
    yield
    forget_modules()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty site folder first on ``sys.path`` (caches invalidated)."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    return folder


def install(site: Path, dist: str, name: str, module: str, source: str) -> None:
    add_module(site, module, source)
    add_plugin(site, dist, "1.0", {name: module})


def one_line(message: str) -> str:
    assert "\n" not in message and "<module" not in message, message  # no pluggy dict dump
    return message


def broken(pm) -> dict[str, str | None]:
    return {i.name: i.cause for i in pm.plugin_infos() if i.status == "broken"}


# -- an installed plugin that fails is skipped, with one warning -------------------------


def test_a_failing_import_skips_that_plugin_with_a_warning_naming_it(site: Path) -> None:
    install(site, "broken-dist", "broken", "pl_test_broken", BROKEN)
    install(site, "good-dist", "good", "pl_test_good", FORCE)
    with pytest.warns(BrokenPluginWarning) as caught:
        pm = make_plugin_manager()
    (warning,) = caught
    message = one_line(str(warning.message))
    assert message.startswith(
        "skipped installed plugin 'broken' (broken-dist 1.0, entry point broken = "
        "pl_test_broken): importing it failed: ModuleNotFoundError: No module named "
        "'pl_test_dependency_that_is_not_installed' (at "
    )
    assert f"{site / 'pl_test_broken' / '__init__.py'}:5)" in message
    assert "ORTGEN_DISABLE_PLUGINS=broken" in message
    registry = build_registry(pm)
    assert registry.get("logits_processor", "force").plugin == "good"  # the others work
    assert list(broken(pm)) == ["broken"]


def test_a_hook_that_raises_skips_the_whole_plugin(site: Path) -> None:
    install(site, "hook-dist", "hooks", "pl_test_hooks", HOOK_FAILS)
    pm = make_plugin_manager()
    with pytest.warns(BrokenPluginWarning, match="register_stopping_criteria raised") as caught:
        registry = build_registry(pm)
    assert len(caught) == 1
    assert "RuntimeError: cannot read its settings (at " in str(caught[0].message)
    # its first hook had registered: nothing of a skipped plugin stays
    assert "half_registered" not in registry.names("sampler")
    assert "greedy" in registry.names("sampler")
    assert list(broken(pm)) == ["hooks"]
    with warnings.catch_warnings():  # the plugin left the manager: a second build is quiet
        warnings.simplefilter("error")
        assert "half_registered" not in build_registry(pm).names("sampler")


@pytest.mark.parametrize(
    ("source", "cause"),
    [
        (  # a misspelt hook
            "import ortgen\n@ortgen.hookimpl\ndef register_sampler(register):\n    pass\n",
            "it implements 'register_sampler', which is not an ortgen hook",
        ),
        (  # a hook with the wrong argument
            "import ortgen\n@ortgen.hookimpl\ndef register_samplers(reg):\n    pass\n",
            "it is invalid: Plugin 'bad' for hook 'register_samplers'",
        ),
        (  # a built-in's name taken without replace=True
            "import ortgen\n@ortgen.hookimpl\ndef register_samplers(register):\n"
            "    register('mine', lambda: None)\n    register('greedy', lambda: None)\n",
            "sampler 'greedy' is registered twice: by plugin 'ortgen.plugins.samplers' and by "
            "plugin 'bad'",
        ),
        (  # a name that is not a string
            "import ortgen\n@ortgen.hookimpl\ndef register_samplers(register):\n"
            "    register(7, lambda: None)\n",
            "plugin 'bad' registered a sampler with a bad name: 7",
        ),
    ],
)
def test_an_invalid_installed_plugin_is_skipped(site: Path, source: str, cause: str) -> None:
    install(site, "bad-dist", "bad", "pl_test_bad", source)
    with pytest.warns(BrokenPluginWarning) as caught:
        registry = build_registry(pm := make_plugin_manager())
    assert len(caught) == 1 and cause in one_line(str(caught[0].message))
    assert cause in (broken(pm)["bad"] or "")
    assert registry.get("sampler", "greedy").plugin == "ortgen.plugins.samplers"
    assert "mine" not in registry.names("sampler")


def test_two_installed_plugins_claiming_a_name_skip_the_second(site: Path) -> None:
    install(site, "first-dist", "first", "pl_test_first", FORCE)
    install(site, "second-dist", "second", "pl_test_second", FORCE)
    with pytest.warns(BrokenPluginWarning) as caught:
        registry = build_registry(pm := make_plugin_manager())
    (warning,) = caught
    owners = {registry.get("logits_processor", "force").plugin}
    skipped = ({"first", "second"} - owners).pop()  # sys.path order decides which is first
    message = one_line(str(warning.message))
    assert f"skipped installed plugin {skipped!r}" in message
    assert "logits_processor 'force' is registered twice: by plugin" in message
    assert {"'first'", "'second'"} <= set(message.replace(",", " ").split())
    assert list(broken(pm)) == [skipped]


def test_two_distributions_with_one_entry_point_name(site: Path) -> None:
    add_module(site, "pl_test_a", FORCE)
    add_module(site, "pl_test_b", FORCE.replace('"force"', '"other"'))
    add_plugin(site, "a-dist", "1.0", {"same": "pl_test_a"})
    add_plugin(site, "b-dist", "2.0", {"same": "pl_test_b"})
    with pytest.warns(BrokenPluginWarning, match="entry-point name is taken by") as caught:
        pm = make_plugin_manager()
    message = one_line(str(caught[0].message))
    assert "a-dist 1.0" in message and "b-dist 2.0" in message  # both owners
    assert [i.status for i in pm.plugin_infos() if i.name == "same"] == ["loaded", "broken"]


def test_one_warning_per_plugin_per_process(site: Path) -> None:
    """``load()`` may build more than one manager (a pipeline file, a draft model): the
    warning is shown once, as Python shows a warning once per place by default."""
    install(site, "broken-dist", "broken", "pl_test_broken", BROKEN)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        make_plugin_manager()
        make_plugin_manager()
    assert [w.category for w in caught] == [BrokenPluginWarning]


# -- built-in and in-process plugins still raise --------------------------------------


def test_an_in_process_plugin_that_fails_raises() -> None:
    class Fails:
        @hookimpl
        def register_samplers(self, register):
            raise RuntimeError("boom")

    with pytest.raises(ortgen.PluginError, match=r"Fails' failed in register_samplers: Runtime"):
        build_registry(make_plugin_manager(load_entry_points=False, extra=[Fails()]))


# -- registered twice -------------------------------------------------------------------


def test_an_installed_module_also_passed_in_process_is_registered_once(site: Path) -> None:
    install(site, "good-dist", "good", "pl_test_good", FORCE)
    import pl_test_good  # type: ignore[import-not-found]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pm = make_plugin_manager(extra=[pl_test_good, pl_test_good])
        registry = build_registry(pm)
    assert registry.get("logits_processor", "force").plugin == "good"  # its entry-point name
    assert [(i.name, i.origin) for i in pm.plugin_infos() if i.origin != "built-in"] == [
        ("good", "installed")
    ]


def test_two_plugin_objects_under_one_name_are_one_line_naming_both(site: Path) -> None:
    install(site, "good-dist", "good", "pl_test_good", FORCE)

    class Plugin:
        @hookimpl
        def register_samplers(self, register):
            pass

    with pytest.raises(ortgen.PluginError) as info:
        make_plugin_manager(extra=[Plugin(), Plugin()])
    name = f"{Plugin.__module__}.{Plugin.__qualname__}"
    assert one_line(str(info.value)) == (
        f"plugin {name!r}: its name is taken by another plugin object: plugin {name!r}; "
        "two plugin objects cannot share a name"
    )
    add_module(site, "pl_test_other", FORCE.replace('"force"', '"x"'))
    module = import_plugin("pl_test_other")
    module.__name__ = "good"  # an in-process module named like the installed plugin
    with pytest.raises(ortgen.PluginError) as info:
        make_plugin_manager(extra=[module])
    assert one_line(str(info.value)) == (
        "plugin 'good': its name is taken by another plugin object: installed plugin 'good' "
        "(good-dist 1.0, entry point good = pl_test_good); disable the installed one "
        "(disable_plugins=['good']) to use this one"
    )


def test_a_component_claimed_twice_is_one_line_naming_both(site: Path) -> None:
    install(site, "good-dist", "good", "pl_test_good", FORCE)

    class Mine:
        @hookimpl
        def register_logits_processors(self, register):
            register("force", lambda: None)

    with pytest.raises(ortgen.PluginError) as info:
        build_registry(make_plugin_manager(extra=[Mine()]))
    assert one_line(str(info.value)).startswith(
        "logits_processor 'force' is registered twice: by plugin 'good' and by plugin "
        f"'{Mine.__module__}.{Mine.__qualname__}'; pass replace=True"
    )


# -- ORTGEN_DISABLE_PLUGINS -----------------------------------------------------------


def test_the_environment_disables_installed_plugins_before_import(
    site: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    install(site, "broken-dist", "broken", "pl_test_broken", BROKEN)
    install(site, "good-dist", "good", "pl_test_good", FORCE)
    marker = tmp_path / "imported"
    monkeypatch.setenv("PL_TEST_MARKER", str(marker))
    monkeypatch.setenv("ORTGEN_DISABLE_PLUGINS", " broken , nobody,mine")
    mine = types.ModuleType("mine")  # in-process, named like a disabled entry point
    mine.register_samplers = hookimpl(lambda register: register("mine", lambda: None))  # type: ignore[attr-defined]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pm = make_plugin_manager(extra=[mine])
    assert not marker.exists()  # never imported
    infos = {i.name: (i.origin, i.status, i.cause) for i in pm.plugin_infos()}
    assert infos["broken"] == ("installed", "disabled", "ORTGEN_DISABLE_PLUGINS")
    assert infos["good"] == ("installed", "loaded", None)
    assert infos["nobody"] == ("unknown", "disabled", "ORTGEN_DISABLE_PLUGINS")
    # the variable names entry points: a plugin asked for in-process still loads
    assert infos["mine"] == ("in-process", "loaded", None)
    assert build_registry(pm).get("sampler", "mine").plugin == "mine"


def test_the_environment_does_not_disable_a_builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTGEN_DISABLE_PLUGINS", "ortgen.plugins.samplers")
    with pytest.warns(UserWarning, match="names 'ortgen.plugins.samplers', a built-in module"):
        registry = build_registry(make_plugin_manager())
    assert registry.get("sampler", "greedy").plugin == "ortgen.plugins.samplers"
    # disabling a built-in stays possible, per load
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        registry = build_registry(make_plugin_manager(disable=["ortgen.plugins.samplers"]))
    assert "greedy" not in registry.names("sampler")


# -- --plugin: a module or a file -----------------------------------------------------


def test_a_plugin_file_is_imported_once_under_its_stem(tmp_path: Path) -> None:
    path = tmp_path / "pl_test_file.py"
    path.write_text(FORCE)
    module = import_plugin(str(path))
    assert module.__name__ == "pl_test_file" and sys.modules["pl_test_file"] is module
    assert import_plugin(str(path)) is module  # asked again: the same module
    registry = build_registry(make_plugin_manager(load_entry_points=False, extra=[module]))
    assert registry.get("logits_processor", "force").plugin == "pl_test_file"


@pytest.mark.parametrize(
    ("name", "source", "message"),
    [
        ("json.py", FORCE, r"a module named 'json' is imported already \(.*json.*\); rename"),
        (
            "pl_test_fails.py",
            "1 / 0\n",
            r"importing it failed: ZeroDivisionError: division by zero \(at .*:1\)",
        ),
        ("pl-test.py", FORCE, "'pl-test' is not a Python module name; rename the file"),
        ("missing.py", None, "no such file"),
        ("__init__.py", FORCE, r"a package is given by name \(--plugin test_a_plugin_file_that"),
    ],
)
def test_a_plugin_file_that_cannot_be_imported(tmp_path: Path, name, source, message) -> None:
    path = tmp_path / name
    if source is not None:
        path.write_text(source)
    with pytest.raises(ortgen.PluginError, match=rf"^--plugin {path}: {message}"):
        import_plugin(str(path))
    assert "pl_test_fails" not in sys.modules


def test_a_plugin_file_never_hides_an_importable_module(site: Path, tmp_path: Path) -> None:
    """Imported under its stem, a file named like a module not imported yet (the user's
    ``plugin.py`` and someone's ``plugin`` package) would take that module's place for
    the whole process."""
    add_module(site, "pl_test_taken", "VALUE = 1\n")
    path = tmp_path / "pl_test_taken.py"
    path.write_text(FORCE)
    with pytest.raises(ortgen.PluginError, match=r"it would hide the module 'pl_test_taken' \("):
        import_plugin(str(path))
    assert "pl_test_taken" not in sys.modules


def test_a_plugin_module_that_cannot_be_imported(site: Path) -> None:
    with pytest.raises(ortgen.PluginError, match=r"no module of that name on sys.path .*\./pl"):
        import_plugin("pl_test_nowhere.sub")
    add_module(site, "pl_test_broken", BROKEN)
    with pytest.raises(ortgen.PluginError, match=r"failed: ModuleNotFoundError: .*not_installed'"):
        import_plugin("pl_test_broken")
