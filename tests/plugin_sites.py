"""Installed plugins for tests, built as a user's pip install leaves them: a folder for
``sys.path`` / ``PYTHONPATH`` holding each plugin's package and a ``*.dist-info`` with
its ``entry_points.txt`` in ortgen's group. Not a test module.

Every module is named ``pl_test_*`` so a test can forget them (``forget_modules``).
"""

from __future__ import annotations

import sys
from pathlib import Path

PREFIX = "pl_test_"

#: a processor that leaves only ``token`` possible: its effect on the output is exact
FORCE = """
import numpy as np
import ortgen


class Force:
    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores):
        out = np.full_like(scores, -np.inf)
        out[:, self.token] = 0.0
        return out


@ortgen.hookimpl
def register_logits_processors(register):
    register("force", Force)
"""

#: a plugin whose own import fails (a dependency that is not installed); with
#: ``$PL_TEST_MARKER`` set it first touches that file, so a test sees it was imported
BROKEN = """
import os, pathlib
if "PL_TEST_MARKER" in os.environ:
    pathlib.Path(os.environ["PL_TEST_MARKER"]).touch()
import pl_test_dependency_that_is_not_installed
"""

#: a plugin whose first hook registers and whose second raises
HOOK_FAILS = """
import ortgen


@ortgen.hookimpl
def register_samplers(register):
    register("half_registered", lambda: None)


@ortgen.hookimpl
def register_stopping_criteria(register):
    raise RuntimeError("cannot read its settings")
"""


def add_plugin(site: Path, dist: str, version: str, entry_points: dict[str, str]) -> None:
    """A distribution ``dist`` in ``site`` declaring ``entry_points`` (name -> module)."""
    folder = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "".join(f"{name} = {module}\n" for name, module in entry_points.items())
    (folder / "entry_points.txt").write_text(f"[ortgen]\n{lines}")


def add_module(site: Path, name: str, source: str) -> Path:
    """Package ``name`` (``name/__init__.py``) holding ``source``."""
    assert name.startswith(PREFIX), name
    package = site / name
    package.mkdir(parents=True)
    path = package / "__init__.py"
    path.write_text(source)
    return path


def forget_modules() -> None:
    """Drop the test plugins from ``sys.modules``: the next test's site has its own."""
    for name in [n for n in sys.modules if n.startswith(PREFIX)]:
        del sys.modules[name]
