"""The code blocks of the README and docs/: each one says what it is, and the complete ones run.

A block whose first line is ``# file: PATH`` is a file of a runnable example: the blocks of one
page are written out together and their tests run, as a reader would run them. Every other
Python block is a fragment or a sketch and says so on its first line (``# fragment``,
``# sketch``), so nobody mistakes it for something that runs as written.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
FILE = re.compile(r"^# file: (\S+)")
SAYS_WHAT_IT_IS = re.compile(r"^# (file: \S+|fragment|sketch)")


def blocks(page: Path) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(page.read_text())]


def files(page: Path) -> dict[str, str]:
    out = {}
    for _, body in blocks(page):
        m = FILE.match(body)
        if m:
            out[m.group(1)] = body
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_says_what_it_is(page: Path) -> None:
    unlabelled = [
        body.splitlines()[0] if body.strip() else "(empty)"
        for lang, body in blocks(page)
        if lang == "python" and not SAYS_WHAT_IT_IS.match(body)
    ]
    assert unlabelled == [], f"{page.name}: blocks without '# file:', '# fragment' or '# sketch'"


RUNNABLE = [p for p in PAGES if any(f.startswith("tests/test_") for f in files(p))]


def test_the_readme_has_a_runnable_example() -> None:
    assert ROOT / "README.md" in RUNNABLE


@pytest.mark.crash
@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_runnable_examples_run_as_written(page: Path, tmp_path: Path) -> None:
    for path, body in files(page).items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
    tests = sorted(p for p in files(page) if p.startswith("tests/test_"))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(rf"^{len(tests)} passed", proc.stdout, re.MULTILINE), proc.stdout
