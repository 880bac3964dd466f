"""The wheel holds every package: pyproject.toml lists ortgen's packages by hand
(``[tool.setuptools] packages``), and an editable install finds a package left off that
list anyway, so only a real install would show the gap."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_for_the_wheel():
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    for folder, name in (("framework", "ortgen"), ("plugins", "ortgen.plugins")):
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    assert found - listed == set(), "add these to [tool.setuptools] packages"
