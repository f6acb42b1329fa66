"""Screenshots of what the Temporal UI shows the person on call (not part of the test suite).

Starts the embedded Temporal server with its UI, the demo bank and a worker; runs a call that
waits for approval, a call whose outcome is unknown (parked, no probe) and a plain call; then
drives a headless Chromium through Playwright over the workflow pages and the three saved-view
queries, and saves PNGs to the folder given (default /tmp/exactcall-ui).

Needs Playwright's Python package (``pip install playwright``) and a Chromium on
the machine (Debian: ``apt-get install chromium``); no browser is downloaded::

    python scripts/ui_screenshots.py [OUT_DIR] [--chromium /usr/bin/chromium] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import urllib.parse
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.client import Client, WorkflowHandle

import exactcall
from exactcall import approvals, reconciliation
from exactcall._ui import SAVED_VIEWS
from exactcall._worker import Connection, build_worker, connect
from exactcall.demo.bank import Bank
from exactcall.demo.bank_client import post_payment
from exactcall.embedded._server import DevServer, free_port

TASK_QUEUE = "ui-screenshots"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@exactcall.tool(approval=True, heartbeat_timeout=timedelta(seconds=2))
def refund(bank: str, amount: int, to: str, memo: str) -> dict[str, Any]:
    """A refund a person approves first (exact arguments)."""
    return post_payment(bank, amount, to, exactcall.idempotency_headers())


@exactcall.tool(heartbeat_timeout=timedelta(seconds=2))
def wire(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Sends the payment, then loses the answer; no probe, so the call is parked."""
    post_payment(bank, amount, to, exactcall.idempotency_headers())
    raise ConnectionResetError("connection reset after the request was sent")


@exactcall.tool(heartbeat_timeout=timedelta(seconds=2))
def pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    return post_payment(bank, amount, to, exactcall.idempotency_headers())


@workflow.defn(name="SupportAgent", sandboxed=False)  # defined in a script: no sandbox
class SupportAgent:
    """A plain Temporal workflow that calls one tool through exactcall."""

    @workflow.run
    async def run(self, tool: str, args: list[Any]) -> Any:
        return await exactcall.call(tool, *args)


async def eventually(what: str, check: Any, timeout: float = 30) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        await asyncio.sleep(0.2)


async def scenario(client: Client, bank: str) -> dict[str, WorkflowHandle[Any, Any]]:
    """Three agents: one waits for approval, one is parked, one is done."""
    runs = {
        "waiting": ("refund", [bank, 120, "acct-bob", "refund of order 42"]),
        "parked": ("wire", [bank, 950, "acct-carol"]),
        "done": ("pay", [bank, 10, "acct-dave"]),
    }
    handles = {}
    for name, (tool, args) in runs.items():
        handles[name] = await client.start_workflow(
            SupportAgent.run,
            args=[tool, args],
            id=f"support-agent-{name}",
            task_queue=TASK_QUEUE,
            static_summary=f"support agent ({name})",
        )
    await handles["done"].result()
    wid = handles["waiting"].id
    await eventually("the pending call", lambda: _pending(client, wid))
    await eventually("the parked call", lambda: _parked(client, handles["parked"].id))
    return handles


async def _pending(client: Client, workflow_id: str) -> bool:
    return bool((await approvals.view(client, workflow_id)).pending)


async def _parked(client: Client, workflow_id: str) -> bool:
    return any(r.workflow_id == workflow_id for r in await reconciliation.list_unresolved(client))


def ids(handles: dict[str, WorkflowHandle[Any, Any]]) -> dict[str, str]:
    """Workflow ids to look at: an agent, the parked call's reconciliation and a record."""

    def key(name: str, tool: str) -> str:
        return exactcall.derive_key("default", handles[name].id, f"{tool}#1", tool, "1")

    return {
        "workflow-waiting-for-approval": handles["waiting"].id,
        "reconciliation-parked": reconciliation.reconcile_id(key("parked", "wire")),
        "call-record": f"exactcall-call-{key('done', 'pay')}",
    }


async def shoot(ui: str, pages: dict[str, str], out: Path, chromium: str) -> list[Path]:
    """Each workflow's page and its User Metadata tab, then the list under each saved view."""
    from playwright.async_api import async_playwright

    saved: list[Path] = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        # tall: the UI's panels scroll inside the page, so a full-page shot stops at the viewport
        page = await browser.new_page(viewport={"width": 1600, "height": 2200})
        for name, wid in pages.items():
            url = f"{ui}/namespaces/default/workflows/{urllib.parse.quote(wid, safe='')}"
            saved.append(await _shot(page, url, out / f"{name}.png", wid))
            await page.get_by_text("User Metadata", exact=True).first.click()
            await page.wait_for_timeout(1500)
            saved.append(await _save(page, out / f"{name}-metadata.png", page.url))
        views = {"All workflows": "", **SAVED_VIEWS}  # the first, to compare the last with
        for name, query in views.items():
            url = f"{ui}/namespaces/default/workflows?query={urllib.parse.quote(query)}"
            slug = "view-" + name.lower().replace(" ", "-")
            saved.append(await _shot(page, url, out / f"{slug}.png", None))
        await browser.close()
    return saved


async def _shot(page: Any, url: str, path: Path, wait_text: str | None) -> Path:
    await page.goto(url, wait_until="load")
    if wait_text:
        await page.get_by_text(wait_text).first.wait_for(timeout=15_000)
    await page.wait_for_timeout(1500)  # the UI queries the workflow after the page loads
    return await _save(page, path, url)


async def _save(page: Any, path: Path, url: str) -> Path:
    await page.screenshot(path=str(path), full_page=True)
    print(f"saved {path}  ({url})")
    return path


async def run(server: DevServer, bank: Bank, out: Path, chromium: str, keep: bool) -> int:
    client = await connect(Connection(address=server.address, namespace="default"))
    async with build_worker(client, TASK_QUEUE, [SupportAgent]):
        handles = await scenario(client, bank.url)
        if server.ui_url is None:
            raise RuntimeError("the server runs without its UI")
        await shoot(server.ui_url, ids(handles), out, chromium)
        if keep:
            print(f"UI at {server.ui_url}; Ctrl-C to stop")
            await asyncio.Event().wait()
        for h in handles.values():
            await _stop(h)
    return 0


async def _stop(handle: WorkflowHandle[Any, Any]) -> None:
    desc = await handle.describe()
    if desc.status is not None and desc.status.name == "RUNNING":
        await handle.terminate("screenshots taken")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("out", nargs="?", type=Path, default=Path("/tmp/exactcall-ui"))
    p.add_argument("--chromium", default="/usr/bin/chromium", help="the Chromium to drive")
    p.add_argument("--keep", action="store_true", help="keep the UI up after the screenshots")
    ns = p.parse_args(argv)
    if not Path(ns.chromium).exists():
        print(f"no Chromium at {ns.chromium}: apt-get install chromium, or --chromium PATH")
        return 2
    try:
        import playwright  # noqa: F401
    except ImportError:
        print("Playwright is not installed: pip install playwright")
        return 2
    ns.out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory() as tmp,
        DevServer(headless=False, ui_port=free_port(), fast=True) as server,
        Bank(Path(tmp) / "bank.db") as bank,
    ):
        return asyncio.run(run(server, bank, ns.out, ns.chromium, ns.keep))


if __name__ == "__main__":
    sys.exit(main())
