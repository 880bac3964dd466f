"""The layers hold: the framework imports no built-in plugin (it loads them by name, as
entry points), and the import contract in pyproject.toml is kept (``lint-imports``)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FRAMEWORK = Path(__file__).resolve().parents[1] / "framework"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.level == 0:
                found.add(node.module)
            else:  # a relative import: resolve it against the file's package
                package = path.relative_to(FRAMEWORK).parent.parts
                base = ["ortgen", *package][: len(package) + 2 - node.level]
                found.add(".".join([*base, node.module]))
    return found


def test_the_framework_imports_no_built_in_plugin() -> None:
    offenders = {
        str(path.relative_to(FRAMEWORK)): sorted(m for m in mods if m.startswith("ortgen.plugins"))
        for path in FRAMEWORK.rglob("*.py")
        if (mods := _imported_modules(path)) and any(m.startswith("ortgen.plugins") for m in mods)
    }
    assert offenders == {}


def test_a_plugin_import_would_be_found(tmp_path: Path) -> None:
    """The check above can fail: an import of a built-in is seen, relative or absolute."""
    probe = FRAMEWORK / "loop" / "generate.py"
    assert "ortgen.loop.chain" in _imported_modules(probe)
    fake = tmp_path / "x.py"
    fake.write_text("import numpy\nfrom ortgen.plugins.caches import StaticCache\n")
    assert "ortgen.plugins.caches" in _imported_modules(fake)


def test_the_import_contract_is_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists() and shutil.which("lint-imports") is None:
        pytest.fail("lint-imports is missing: install the dev extra (pip install -e '.[dev]')")
    command = [str(lint)] if lint.exists() else ["lint-imports"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=FRAMEWORK.parent)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


#: the root of framework/: the facade (``ortgen``, ``load``/``TextGenerator``, the
#: plugin author's public modules ``errors``, ``checks`` and ``load_draft_model``) and
#: the version; everything else lives in a package that says what layer it is
FACADE = {"__init__.py", "api.py", "errors.py", "checks.py", "draft_models.py", "version.py"}


def test_the_root_holds_only_the_facade_and_the_packages() -> None:
    modules = {path.name for path in FRAMEWORK.glob("*.py")}
    assert modules == FACADE, "put new modules in the package of their layer"


def test_every_package_is_in_an_import_contract() -> None:
    """Each of ortgen's packages and root modules is named (itself or a module in it) by a
    contract in pyproject.toml, so no part of the code is outside every rule."""
    import tomllib

    config = tomllib.loads((FRAMEWORK.parent / "pyproject.toml").read_text())["tool"]
    named: set[str] = set()
    for contract in config["importlinter"]["contracts"]:
        for key in ("layers", "source_modules", "forbidden_modules"):
            for entry in contract.get(key, []):
                named.update(part.strip() for part in entry.replace(":", "|").split("|"))
    parts = {f"ortgen.{p.name}" for p in FRAMEWORK.iterdir() if (p / "__init__.py").is_file()}
    parts |= {f"ortgen.{p.stem}" for p in FRAMEWORK.glob("*.py") if p.stem != "__init__"}
    missing = {p for p in parts if not any(n == p or n.startswith(p + ".") for n in named)}
    assert missing == set(), "add these to a contract in pyproject.toml"
