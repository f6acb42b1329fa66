"""``exactcall demo``: run as a user would, end to end, with real worker processes killed."""

from __future__ import annotations

import asyncio
import os
import re
import sys

import pytest

from exactcall import reconciliation
from exactcall._worker import Connection, connect
from exactcall.embedded._server import DevServer
from exactcall.workflows import record_id

pytestmark = pytest.mark.crash

TIMEOUT = 120.0
ROWS = {
    "plain Temporal activity": (2, "paid twice"),
    "exactcall (bank dedupes the key)": (1, "done: re-sent with the same key"),
    "exactcall (crash inside, with a probe)": (1, "reconciled: landed by the probe"),
    "exactcall (crash inside, no probe)": (1, "unknown: not re-sent, unresolved"),
    "exactcall (approval of exact args)": (1, "the approved call paid"),
}
PARKED = re.compile(
    r"^\s+unresolved; `exactcall resolve (exactcall-demo-parked-\S+) pay_no_key#1 "
    r"--landed --result JSON\|--not-landed\|--abandon` resolves it$",
    re.MULTILINE,
)
APPROVAL = (
    "yes to pay(10, alice) -> paid; the model changed it to pay(9999, mallory) -> "
    "that yes was rejected (hash mismatch); denied, nothing ran"
)


async def run_demo(*args: str) -> tuple[int, str]:
    env = {**os.environ}
    for name in ("EXACTCALL_CRASH_AT", "EXACTCALL_DEMO_CRASH_BARE"):
        env.pop(name, None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "exactcall",
        "demo",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
        pytest.fail(f"exactcall demo did not finish within {TIMEOUT:.0f} s:\n{out.decode()}")
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


def assert_table(out: str) -> None:
    for label, (payments, note) in ROWS.items():
        row = re.search(rf"^\s+{re.escape(label)}\s+payments: (\d+)\s+(.*)$", out, re.MULTILINE)
        assert row, f"no row for {label!r}:\n{out}"
        assert int(row.group(1)) == payments, out
        assert row.group(2).startswith(note), out
    assert PARKED.search(out), out
    assert f"      {APPROVAL}\n" in out, out
    assert "the same approval: rejected (hash mismatch)" in out, out
    assert "unexpected:" not in out, out
    assert re.search(r"^finished in \d+\.\d s$", out, re.MULTILINE), out


async def test_demo_starts_the_embedded_server() -> None:
    code, out = await run_demo("--address", "127.0.0.1:1")
    assert code == 0, out
    assert "No Temporal server at 127.0.0.1:1: started the embedded one on 127.0.0.1:" in out
    assert_table(out)
    assert "(it ends with the embedded server; on yours it stays unresolved)" in out


async def test_demo_uses_a_running_server(server: DevServer) -> None:
    code, out = await run_demo("--address", server.address, "--namespace", "default")
    assert code == 0, out
    assert "embedded" not in out, out
    assert_table(out)
    assert "(a worker must serve it: exactcall worker --task-queue exactcall-demo-parked-" in out
    # the parked call outlives the demo on a server of your own, listed for a person
    match = PARKED.search(out)
    assert match
    client = await connect(Connection(address=server.address, namespace="default"))
    rows = [r for r in await reconciliation.list_unresolved(client) if r.workflow_id == match[1]]
    assert [(r.tool, r.step) for r in rows] == [("pay_no_key", "pay_no_key#1")]
    # no worker serves its task queue any more: end it, the session's server is shared
    for wid in (rows[0].reconcile_id, record_id(rows[0].key)):
        await client.get_workflow_handle(wid).terminate(reason="test over")
