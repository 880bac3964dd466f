"""A client library that cannot be installed beside the suite's own packages, in a small
virtual environment of its own (not a test module).

instructor is one: every release pins ``jiter<0.15`` and the ``openai`` client the suite
uses (3.51) needs ``jiter>=0.16``, so one environment cannot hold both. The tests build
``python -m venv`` + ``pip install instructor==1.17.0`` once (pip picks the newest
``openai`` instructor accepts) under pytest's cache folder, and drive the live server
from a subprocess of it. A build that fails (no package index) fails the test that
needed it, naming pip's error: it is a broken test setup, not a skip.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.build_lock import exclusive

INSTRUCTOR = "instructor==1.17.0"


def instructor_python(cache: Path) -> Path:
    """The Python of a venv under ``cache`` with :data:`INSTRUCTOR` installed (built on
    first use; a ``pip freeze`` stamp marks a finished build)."""
    folder = cache / INSTRUCTOR.replace("==", "-")
    python = folder / "bin" / "python"
    stamp = folder / "pip-freeze.txt"
    with exclusive(folder):
        if not stamp.exists():
            shutil.rmtree(folder, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
            _pip(python, "install", "--quiet", "--disable-pip-version-check", INSTRUCTOR)
            stamp.write_text(_pip(python, "freeze", "--disable-pip-version-check"))
    return python


def _pip(python: Path, *args: str) -> str:
    done = subprocess.run(
        [str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args)} failed in {python.parent.parent}:\n{done.stderr}")
    return done.stdout
