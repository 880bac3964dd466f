"""The plugin author's kit (``ortgen.testing``) beyond KV caches: ``make_context`` sets the
context's real fields, and ``check_drafter`` passes drafters that keep the loop's
promises and fails each kind of broken one (drafts past the limit, a tokens argument
written into, state that changes the output later, an ``accepted`` the loop cannot call).
The example package's drafter and composed cache pass the kit, and the example passes
``mypy --strict`` against ortgen installed with its ``py.typed``. KV caches on their own are
in ``tests/test_testing_kv_cache.py``."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ortgen
from ortgen.plugins.drafters import PromptLookupDrafter
from ortgen.testing import FakeModel, check_drafter, check_kv_cache, make_context

# -- make_context -----------------------------------------------------------------------


def test_make_context_sets_the_context_fields_a_component_reads() -> None:
    signature = FakeModel(layout="shared").signature
    tokenizer = object()  # any object: the context only carries it
    ctx = make_context(
        tokenizer=tokenizer, signature=signature, model_config={"sliding_window": 8},
        model_state={"k": 1}, row_seeds=(3, None), batch_size=2,
    )  # fmt: skip
    assert ctx.tokenizer is tokenizer and ctx.extras == {}
    assert ctx.signature is signature
    assert ctx.vocab_size == signature.vocab_size  # the graph's width unless told
    assert dict(ctx.model_config) == {"sliding_window": 8}
    assert ctx.model_state == {"k": 1} and ctx.row_seeds == (3, None)


def test_make_context_refuses_what_it_would_drop_or_contradict() -> None:
    with pytest.raises(TypeError, match="tokeniser"):
        make_context(tokeniser=object())  # type: ignore[call-arg]  # a typo is no fact
    with pytest.raises(ValueError, match="scores 48 tokens"):
        make_context(vocab_size=32, signature=FakeModel().signature)


def test_a_cache_built_from_make_context_reads_its_signature() -> None:
    from ortgen.plugins.caches import StaticCache

    signature = FakeModel(layout="shared").signature
    cache = StaticCache(ctx=make_context(signature=signature, batch_size=2, max_length=10))
    assert cache.signature is signature
    assert cache.nbytes == 2 * 2 * 10 * 8 * 4 * len(signature.past_inputs)


# -- check_drafter: drafters that keep the promises -------------------------------------


class RepeatDrafter:
    """Proposes the row's newest token again, up to ``num_tokens`` times; how many adapts
    to what was kept (one more than kept), like the built-ins."""

    def __init__(self, *, num_tokens: int = 3) -> None:
        self.num_tokens = self.next_count = num_tokens

    def draft(self, tokens: np.ndarray, limit: int) -> list[int]:
        return [int(tokens[-1])] * min(limit, self.next_count)

    def accepted(self, drafted: int, kept: int) -> None:
        self.next_count = max(1, min(self.num_tokens, kept + 1))


def _counts(result: str) -> tuple[int, int]:
    found = re.search(r"drafted (\d+), kept (\d+)", result)
    assert found, result
    return int(found.group(1)), int(found.group(2))


@pytest.mark.parametrize("layout", ["shared", "concat"])
def test_good_drafters_pass_with_drafts_both_kept_and_rejected(layout: str) -> None:
    model = FakeModel(layout=layout)
    for factory, params in ((PromptLookupDrafter, {"num_tokens": 4}), (RepeatDrafter, {})):
        report = check_drafter(factory, params, model=model)
        assert set(report) == {"greedy", "sampled", "copying", "short", "eos"}
        assert all(r.startswith("same as without it") for r in report.values()), report
        counts = [_counts(r) for r in report.values()]
        assert sum(kept for _, kept in counts) > 0  # the kept path ran
        assert any(kept < drafted for drafted, kept in counts)  # and the rejected one
        assert all("told accepted()" in r for r in report.values())


class TargetDrafter:
    """Drafts with the target model itself, greedy, under the request's repetition
    penalty: a draft model as good as it gets, so greedy drafts are all kept, and one
    that ends the row (an end-of-text id) is the model's own token there."""

    MODEL = FakeModel(layout="shared")

    def __init__(self, *, ctx: ortgen.GenerationContext) -> None:
        stand_in: Any = self.MODEL
        self.gen = ortgen.TextGenerator(self.MODEL.path, model=stand_in)
        self.penalty = ctx.config.repetition_penalty

    def draft(self, tokens: np.ndarray, limit: int) -> list[int]:
        out = self.gen.generate(
            [tokens.tolist()], max_new_tokens=limit, do_sample=False,
            repetition_penalty=self.penalty,
        )  # fmt: skip
        return out.tokens[0]

    def accepted(self, drafted: int, kept: int) -> None:
        pass


def test_a_perfect_drafter_has_every_greedy_draft_kept() -> None:
    """Also the ``eos`` scenario's point: the row ends on a draft token the model picked,
    which is then its own token, not a kept draft (``accepted`` is checked against
    that count, so a wrong count fails here)."""
    report = check_drafter(TargetDrafter, model=TargetDrafter.MODEL)
    for scenario in ("greedy", "copying", "short"):
        drafted, kept = _counts(report[scenario])
        assert drafted == kept > 0, report[scenario]
    drafted, kept = _counts(report["eos"])  # one draft, cut where its token ended the row
    assert 0 < kept < drafted, report["eos"]


def test_a_drafter_without_accepted_passes_and_is_reported_so() -> None:
    class Plain:
        def draft(self, tokens: np.ndarray, limit: int) -> list[int]:
            return [int(tokens[-1])] * min(limit, 2)

    report = check_drafter(Plain)
    assert all(r.endswith("no accepted(): never told what was kept") for r in report.values())


# -- check_drafter: broken drafters ----------------------------------------------------


class FixedLength:
    """Always proposes its last four tokens, whatever the limit."""

    def draft(self, tokens: np.ndarray, limit: int) -> list[int]:
        return tokens[-4:].tolist()


class WritesTokens:
    """Marks where it has been by writing into the row it was shown."""

    def draft(self, tokens: np.ndarray, limit: int) -> list[int]:
        tokens[-1] = 0
        return []


class KeepsTheView(RepeatDrafter):
    """Keeps the tokens view as its state and updates it once told what was kept: the
    request's own buffer changes under it."""

    def draft(self, tokens: np.ndarray, limit: int) -> list[int]:
        self.row = tokens
        return super().draft(tokens, limit)

    def accepted(self, drafted: int, kept: int) -> None:
        super().accepted(drafted, kept)
        self.row[-1] = (self.row[-1] + 1) % 48


class MisnamedAccepted(RepeatDrafter):
    """Its adaptation sits under a name the loop never calls."""

    accepted = None  # type: ignore[assignment]

    def accept(self, drafted: int, kept: int) -> None:
        RepeatDrafter.accepted(self, drafted, kept)


class OneArgumentAccepted(RepeatDrafter):
    def accepted(self, kept: int) -> None:  # type: ignore[override]
        self.next_count = kept + 1


class SilentDrafter:
    def draft(self, tokens: np.ndarray, limit: int) -> list[int]:
        return []


@pytest.mark.parametrize(
    ("drafter", "message"),
    [
        (FixedLength, r"returned \[.*\] for limit \d; expected at most"),
        (WritesTokens, "wrote into its tokens argument"),
        (KeepsTheView, "the output differs from decoding without the drafter"),
        (MisnamedAccepted, r"has accept\(\) but no accepted\(drafted, kept\)"),
        (OneArgumentAccepted, r"failed in accepted\(drafted=\d+, kept=\d+\): TypeError"),
        (SilentDrafter, "proposed nothing in any scenario"),
    ],
    ids=[
        "past-the-limit",
        "writes-tokens",
        "state-corrupts-output",
        "misnamed-accepted",
        "accepted-arity",
        "never-drafts",
    ],
)
def test_a_broken_drafter_fails(drafter: Any, message: str) -> None:
    with pytest.raises(ortgen.ComponentError, match=message):
        check_drafter(drafter)


def test_a_failure_names_the_scenario() -> None:
    with pytest.raises(ortgen.ComponentError, match="scenario 'greedy'"):
        check_drafter(FixedLength)


# -- the example package: its drafter and composed cache pass the kit, and mypy --------

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ortgen-plugin-example"


@pytest.fixture(scope="module")
def example() -> types.ModuleType:
    """``ortgen_plugin_example`` imported from its source folder."""
    sys.path.insert(0, str(EXAMPLE))
    try:
        return importlib.import_module("ortgen_plugin_example")
    finally:
        sys.path.remove(str(EXAMPLE))


@pytest.mark.parametrize("layout", ["shared", "concat"])
def test_the_examples_drafter_passes_check_drafter(example: types.ModuleType, layout: str) -> None:
    report = check_drafter(example.RepeatTokenDrafter, model=FakeModel(layout=layout))
    assert sum(_counts(r)[1] for r in report.values()) > 0, report  # some drafts kept


def test_the_examples_composed_cache_passes_check_kv_cache_on_both_layouts(
    example: types.ModuleType,
) -> None:
    report = check_kv_cache(example.CappedStaticCache, {"max_positions": 64})
    assert all(r == "same as 'dynamic'" for r in report["concat"].values()), report
    assert all(r == "same as 'static'" for r in report["shared"].values()), report


def test_the_composed_cache_holds_its_cap(example: types.ModuleType) -> None:
    """What the wrapper adds to the built-in: a request that may reach more positions
    is refused before it starts, and one continued past the cap fails naming it."""
    model = FakeModel(layout="shared")
    stand_in: Any = model
    gen = ortgen.TextGenerator(model.path, model=stand_in, plugins=[example])
    capped = {"name": "capped_static", "max_positions": 12}
    with pytest.raises(ortgen.ConfigError, match="may reach 14 positions, more than"):
        gen.generate([[1, 2, 3, 4]], max_new_tokens=10, cache=capped)
    state = gen.start([[1, 2, 3, 4]], max_new_tokens=8, cache=capped)
    while not state.is_done:
        state.step()
    state.append([[5, 6, 7]])
    with pytest.raises(ortgen.ComponentError, match="more than max_positions=12"):
        state.step()


def test_the_public_cache_classes_are_the_registered_built_ins_and_documented() -> None:
    from ortgen.plugin_host.manager import build_registry, make_plugin_manager
    from ortgen.plugins import caches

    registry = build_registry(make_plugin_manager())
    assert registry.get("kv_cache", "static").factory is caches.StaticCache
    assert registry.get("kv_cache", "dynamic").factory is caches.DynamicCache
    guide = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    section = guide[guide.index("### Composing a built-in cache") :]
    for name in caches.__all__:
        assert callable(getattr(caches, name))
        assert f"`{name}" in section, f"{name} is public but not in docs/plugins.md"


@pytest.fixture(scope="module")
def installed_ortgen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ortgen pip-installed (no deps, no index) from a copy of its sources, as a plugin
    author's environment has it: only what the packaging ships (py.typed or not)."""
    root = tmp_path_factory.mktemp("ortgen-installed")
    source, site = root / "src", root / "site"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("framework", "plugins"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "--target", str(site), str(source)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return site


def _mypy(folder: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mypy`` run in the package's folder, as its author would (its pyproject.toml says
    strict), with ortgen importable only from ``site``."""
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(folder / ".mypy_cache")],
        cwd=folder, env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_the_example_passes_mypy_strict_against_the_installed_ortgen(
    installed_ortgen: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "example"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    clean = _mypy(folder, installed_ortgen)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "Success: no issues found in 3 source files" in clean.stdout
    # the same run sees ortgen's types: a misuse of the composed built-in is an error
    cache = folder / "ortgen_plugin_example" / "cache.py"
    text = cache.read_text(encoding="utf-8")
    assert "StaticCache(ctx=ctx)" in text
    cache.write_text(text.replace("StaticCache(ctx=ctx)", 'StaticCache(ctx=ctx, capacity="all")'))
    broken = _mypy(folder, installed_ortgen)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert 'Argument "capacity" to "StaticCache" has incompatible type "str"' in broken.stdout
