"""The documentation site builds with ``mkdocs build --strict`` (``make docs``): every
page in the nav, every relative link resolving, the API reference collected from the
docstrings; and a broken link, or a link to a section that does not exist, fails the
build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
#: not --quiet: it hides the warnings --strict counts (a broken link then passes)
MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    args = [*MKDOCS, "-f", str(config), "-d", str(site)]
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)


def test_the_site_builds_strictly_with_the_api_reference(tmp_path):
    result = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    for anchor in ("ortgen.api.load", "ortgen.api.TextGenerator.generate", "ortgen.errors"):
        assert f'id="{anchor}"' in reference, anchor
    server = (tmp_path / "site" / "server" / "index.html").read_text()
    assert "img/chat-page.png" in server  # the screenshot the browser test takes
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    listed = {page for entry in nav for page in entry.values()}
    assert listed == {p.name for p in (ROOT / "docs").glob("*.md")}  # no page left out


@pytest.mark.parametrize(
    ("link", "named"),
    [
        ("[nothing](no-such-page.md)", "no-such-page.md"),
        ("[nowhere](server.md#no-such-section)", "no-such-section"),  # mkdocs' default: info
    ],
)
def test_a_broken_link_fails_the_build(tmp_path, link, named):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    page = docs / "cli.md"
    page.write_text(page.read_text() + f"\nSee {link}.\n")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    python = config["plugins"][1]["mkdocstrings"]["handlers"]["python"]
    python["paths"] = [str(ROOT / ".mkdocs")]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert named in result.stderr
