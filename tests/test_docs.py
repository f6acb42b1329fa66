"""The code blocks of the README and docs/: each one says what it is, and the complete ones run.

A block whose first line is ``# file: PATH`` is a file of a runnable example: the blocks of one
page are written out together and their tests run, as a reader would run them. Every other
Python block is a fragment or a sketch and says so on its first line (``# fragment``,
``# sketch``), so nobody mistakes it for something that runs as written.

The README stays a front door (short, no test count); every link between pages leads to a page
and a heading that exist; and docs/upgrading.md lists every patch id the workflow code asks for.
"""

from __future__ import annotations

import ast
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


def test_the_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 350, "the README is a front door: depth goes to docs/"
    assert not re.search(r"\b\d+ tests\b", text), "no test count in the README: it goes stale"


CODE = re.compile(r"^```.*?^```$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)


def anchors(page: Path) -> set[str]:
    """The anchors a page's headings get, as GitHub makes them."""
    text = CODE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in HEADING.findall(text)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_between_pages_lead_somewhere(page: Path) -> None:
    broken = []
    for target in LINK.findall(CODE.sub("", page.read_text())):
        if re.match(r"\w+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        gone = not dest.exists()
        if gone or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    assert broken == [], f"{page.relative_to(ROOT)}: links to no page or heading"


PATCHED = re.compile(r"workflow\.patched\((\w+|\"[^\"]+\")\)")


def patch_ids() -> set[str]:
    """Every id the library's workflow code asks ``workflow.patched`` for."""
    from exactcall import _wire

    ids = set()
    for folder in ("exactcall", "workflows", "activities", "approvals"):
        for source in (ROOT / folder).rglob("*.py"):
            text = source.read_text()
            names = {
                alias.asname or alias.name: alias.name
                for node in ast.walk(ast.parse(text))
                if isinstance(node, ast.ImportFrom)
                for alias in node.names
            }
            for arg in PATCHED.findall(text):
                literal = arg.startswith('"')
                ids.add(arg.strip('"') if literal else getattr(_wire, names.get(arg, arg)))
    return ids


def test_every_patch_id_is_in_the_upgrade_notes() -> None:
    ids = patch_ids()
    assert len(ids) >= 10, ids  # the scan found them
    notes = (ROOT / "docs" / "upgrading.md").read_text()
    assert sorted(i for i in ids if f"`{i}`" not in notes) == []
