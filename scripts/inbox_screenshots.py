"""Take the screenshots of docs/inbox.md: a dev server, a worker, the demo bank, the inbox as a
process, Debian's headless Chromium. Run: .venv/bin/python scripts/inbox_screenshots.py"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exactcall import approvals  # noqa: E402
from exactcall._worker import Connection, build_worker, connect  # noqa: E402
from exactcall.demo.bank import Bank  # noqa: E402
from exactcall.embedded._server import DevServer  # noqa: E402
from exactcall.inbox import issue_token  # noqa: E402
from tests.conftest import WORKFLOWS, plan, step  # noqa: E402
from tests.inbox_app import InboxProcess, chromium, login  # noqa: E402

OUT = ROOT / "docs" / "images"


async def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="inbox-shots-"))
    with DevServer(fast=True) as server, Bank(tmp / "bank.db") as bank:
        client = await connect(Connection(address=server.address))
        token = issue_token(tmp / "tokens.json", "alice")
        inbox = InboxProcess(server.address, "--tokens", str(tmp / "tokens.json")).wait_ready()
        try:
            async with build_worker(client, "shots", WORKFLOWS), chromium() as browser:
                calls = [
                    ("refund-7f3a", "support-bot", step("transfer", bank.url, 120, "cust-3381")),
                    ("wire-91c2", "finance-agent", step("wire", bank.url, 25000, "acme-ltd")),
                ]
                for wid, by, s in calls:
                    await client.start_workflow(
                        "Agent",
                        plan(s),
                        id=f"{wid}-{uuid.uuid4().hex[:4]}",
                        task_queue="shots",
                        memo={approvals.REQUESTED_BY_MEMO: by},
                    )
                page = await login(browser, inbox.url, token)
                await page.wait_for_function(
                    "document.querySelectorAll('tr.pending').length >= 2", timeout=20_000
                )
                OUT.mkdir(exist_ok=True)
                await page.screenshot(path=str(OUT / "inbox-waiting.png"))
                await page.click("tr.pending a")
                await page.fill("input[name=reason]", "refund for ticket 42, checked the order")
                await page.screenshot(path=str(OUT / "inbox-call.png"), full_page=True)
                await page.click("#approve")
                await page.wait_for_selector("#answer")
                await page.click("main a[href^='/run']")  # the run's page
                await asyncio.sleep(1.5)
                await page.reload()
                await page.screenshot(path=str(OUT / "inbox-run.png"))
        finally:
            inbox.stop()


if __name__ == "__main__":
    asyncio.run(main())
