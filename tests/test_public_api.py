"""What a plugin may import, and the typed registration: the public API a plugin is
written against (docs/plugins.md, "What a plugin may import" and "The hooks").

- every name ``ortgen`` exports resolves (the lazy ones too), and the docs list the same
  public modules as the import contract that holds the built-ins to them;
- the contract type behind that rule (``tests/import_contracts.py``) sees relative,
  lazy and ``from ortgen import module`` imports, and skips annotation-only ones;
- ``Register[F]`` makes a type checker refuse a factory of the wrong kind;
- ``ortgen.checks`` raises what the built-ins raised before it was public.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

import ortgen
from ortgen.checks import as_float, check_pickable, eos_ids, graph_signature, is_int, token_ids
from ortgen.testing import make_context
from tests.import_contracts import _absolute, _imports

ROOT = Path(__file__).resolve().parent.parent


def test_every_exported_name_resolves() -> None:
    missing = [name for name in ortgen.__all__ if getattr(ortgen, name, None) is None]
    assert missing == []
    assert ortgen.best_first is not None and ortgen.StopStringMatcher(["x"]).find("axb") == 1


def _contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["type"] == "public_api")


def test_the_docs_list_the_modules_the_import_contract_allows() -> None:
    guide = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    section = guide.split("## What a plugin may import", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(ortgen(?:\.\w+)*)` \|", section, flags=re.MULTILINE))
    contract = _contract()
    assert contract["source_modules"] == ["ortgen.plugins"]
    assert listed == set(contract["public_modules"])


def test_the_contract_reads_every_kind_of_import(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import numpy\n"
        "from ortgen import GenerationContext, checks\n"
        "from ._cuts import fill\n"
        "from .. import loop\n"
        "if TYPE_CHECKING:\n"
        "    from ortgen.model.session import GraphSignature\n"
        "def f():\n"
        "    from ortgen.text.stop_strings import StopStringMatcher\n"
    )
    known = {"ortgen", "ortgen.checks", "ortgen.loop", "ortgen.plugins._cuts"}
    found = dict(_imports("ortgen.plugins.probe", source, known))
    assert found == {
        "typing": 1,
        "numpy": 2,
        "ortgen": 3,  # GenerationContext: a name of the package
        "ortgen.checks": 3,  # checks: a module of it
        "ortgen.plugins._cuts": 4,
        "ortgen.loop": 5,
        "ortgen.text.stop_strings": 9,  # lazy imports count; TYPE_CHECKING ones do not
    }
    assert _absolute("ortgen.plugins", True, "caches", 1) == "ortgen.plugins.caches"


BAD_PLUGIN = """
from __future__ import annotations

import numpy as np

from ortgen import (
    KVCacheFactory, LogitsProcessorFactory, Register, StoppingCriterionFactory, hookimpl,
)


class OneArgument:
    def __call__(self, scores: np.ndarray) -> np.ndarray:
        return scores


class Criterion:
    finish_reason = "three"

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        return input_ids[:, -1] == 3


@hookimpl
def register_logits_processors(register: Register[LogitsProcessorFactory]) -> None:
    register("bad", OneArgument)  # error: not a logits processor
    register("ok", lambda: (lambda input_ids, scores: scores))
    register("ok2", Criterion, replaces=True)  # error: a misspelt keyword


@hookimpl
def register_kv_caches(register: Register[KVCacheFactory]) -> None:
    register("criterion", Criterion)  # error: not a KV cache


@hookimpl
def register_stopping_criteria(register: Register[StoppingCriterionFactory]) -> None:
    register("three", Criterion)
"""


def test_register_is_typed_per_kind(tmp_path: Path) -> None:
    """mypy (with the repository's config: ``ortgen`` resolves to framework/) refuses the
    registrations of the wrong kind, on their lines, and accepts the others."""
    probe = tmp_path / "bad_plugin.py"
    probe.write_text(BAD_PLUGIN)
    mypy = Path(sys.executable).with_name("mypy")
    if not mypy.exists():
        pytest.fail("mypy is missing: install the dev extra (pip install -e '.[dev]')")
    result = subprocess.run(
        [str(mypy), "--config-file", "pyproject.toml", "--no-error-summary", str(probe)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    errors = re.findall(r"bad_plugin\.py:(\d+): error: (.*)", result.stdout)
    lines = sorted({int(line) for line, _ in errors})
    marked = [n for n, line in enumerate(BAD_PLUGIN.splitlines(), 1) if "# error" in line]
    assert len(marked) == 3 and lines == marked, result.stdout + result.stderr
    assert any("LogitsProcessor" in message for _, message in errors)
    assert any("KVCache" in message for _, message in errors)


def test_checks_raise_what_the_built_ins_raise() -> None:
    assert is_int(3) and not is_int(True) and not is_int(3.0)
    assert as_float("top_p", 1, "a float") == 1.0
    with pytest.raises(ortgen.ConfigError, match="`top_p` has to be a float, but is nan"):
        as_float("top_p", float("nan"), "a float")
    assert token_ids("ids", 3) == (3,) and token_ids("ids", [1, 2]) == (1, 2)
    with pytest.raises(ortgen.ConfigError, match="non-negative integer"):
        token_ids("ids", [-1])
    assert eos_ids(None, make_context(eos_token_ids=[2])) == (2,)
    with pytest.raises(ortgen.ConfigError, match="kv cache 'mine' needs the model's graph"):
        graph_signature(make_context(), "mine")


def test_check_pickable_names_the_row_and_the_cause() -> None:
    check_pickable("s", np.array([0.5, 1.0], dtype=np.float32))
    check_pickable("s", np.array([np.inf], dtype=np.float32), allow_inf=True)
    with pytest.raises(ortgen.NoTokenLeft, match="sampler 's': the scores of row 1 are all -inf"):
        check_pickable("s", np.array([0.0, -np.inf], dtype=np.float32))
    with pytest.raises(ortgen.ComponentError, match="row 0 contain NaN"):
        check_pickable("s", np.array([np.nan], dtype=np.float32))
    with pytest.raises(ortgen.ComponentError, match="row 0 contain \\+inf"):
        check_pickable("s", np.array([np.inf], dtype=np.float32))
