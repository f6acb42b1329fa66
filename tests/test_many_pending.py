"""Many calls waiting for approval on ONE worker process: all listed, all decided, all closed.

200 calls of ``transfer`` (``approval=True``) wait at once on one ``exactcall worker`` whose
workflow cache holds only 50 of them, so most decisions reach an evicted workflow and are
applied after a replay. ``exactcall approvals list --json`` must list every one with its exact
arguments; ``list_pending`` must page through them in small pages and honour ``limit``; then
half are approved and half denied, every workflow closes, and the bank counts exactly the
approved payments. Once with the default sandbox, once with ``--passthrough-all-modules``
(nothing re-imported per run). Nothing here is timed: the figures are in bench/approvals.py.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import gc
import json
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.converter import PayloadCodec

from exactcall import approvals
from exactcall._worker import build_worker
from exactcall.demo.bank import Bank
from exactcall.embedded._server import DevServer
from exactcall.testing import WorkerProcess
from tests import tools
from tests.conftest import ROOT, plan, step
from tests.workflows import Agent

T = TypeVar("T")
PENDING_KEY = SearchAttributeKey.for_bool(approvals.PENDING_ATTRIBUTE)
N = 200
CACHE = 50  # fewer than N: most calls are evicted while they wait
TIMEOUT = 240.0  # generous: a slow shared machine is not a failure


async def until(fn: Callable[[], Awaitable[T]], ok: Callable[[T], bool], what: str) -> T:
    """Poll ``fn`` until ``ok``; fail with ``what`` and the last value after TIMEOUT."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while True:
        value = await fn()
        if ok(value):
            return value
        if loop.time() > deadline:
            raise AssertionError(f"{what}: still {value!r} after {TIMEOUT:g}s")
        await asyncio.sleep(0.25)


async def bounded(items: list[T], fn: Callable[[T], Awaitable[Any]], limit: int = 20) -> list:
    sem = asyncio.Semaphore(limit)

    async def one(x: T) -> Any:
        async with sem:
            return await fn(x)

    return await asyncio.gather(*(one(x) for x in items))


async def cli_list(server: DevServer) -> list[dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "exactcall", "approvals", "list", "--json", "--address", server.address),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-2000:]
    return json.loads(out)


@pytest.mark.parametrize(
    "sandbox", [[], ["--passthrough-all-modules"]], ids=["sandboxed", "passthrough-all-modules"]
)
async def test_many_pending_on_one_worker_listed_decided_closed(
    server: DevServer, client: Client, tq: str, bank: Bank, who: str, sandbox: list[str]
) -> None:
    prefix = f"many-{uuid.uuid4().hex[:8]}-"
    wids = [f"{prefix}{i}" for i in range(N)]
    amount = {wid: i + 1 for i, wid in enumerate(wids)}  # distinct args, so distinct hashes
    worker = WorkerProcess(
        server.address,
        tq,
        tools=["tests.tools"],
        workflows=["tests.workflows"],
        args=["--max-cached-workflows", str(CACHE), "--workflow-task-pollers", "10", *sandbox],
        cwd=ROOT,
    )
    try:
        await worker.started()

        async def start(wid: str) -> None:
            p = plan(step("transfer", bank.url, amount[wid], who))
            await client.start_workflow("Agent", p, id=wid, task_queue=tq)

        await bounded(wids, start)
        where = f"TaskQueue = '{tq}' AND WorkflowType = 'Agent'"
        running = f"ExecutionStatus = 'Running' AND {where}"
        pending = f"{approvals.PENDING_ATTRIBUTE} = true AND {running}"
        await until(
            lambda: client.count_workflows(pending), lambda c: c.count == N, "calls pending"
        )

        # the CLI lists every call, once, with the exact arguments and their hash
        rows = [r for r in await cli_list(server) if r["workflow_id"].startswith(prefix)]
        assert sorted(r["workflow_id"] for r in rows) == sorted(wids)
        for r in rows:
            args = {"bank": bank.url, "amount": amount[r["workflow_id"]], "to": who}
            assert (r["tool"], r["step"], r["args"]) == ("transfer", "transfer#1", args)
            assert r["args_hash"] == tools.transfer.hash(**args)

        # small pages give the same calls as the CLI's; limit caps the workflows read
        paged = await approvals.list_pending(client, page_size=7)
        assert sorted((r.workflow_id, r.args_hash) for r in paged if r.workflow_id in amount) == (
            sorted((r["workflow_id"], r["args_hash"]) for r in rows)
        )
        assert len({r.workflow_id for r in await approvals.list_pending(client, limit=10)}) == 10

        # approve the even, deny the odd; each decision is confirmed by the workflow
        verdict = {wid: ("approve" if i % 2 == 0 else "deny") for i, wid in enumerate(wids)}

        async def decide(r: dict[str, Any]) -> approvals.DecisionResult:
            fn = approvals.approve if verdict[r["workflow_id"]] == "approve" else approvals.deny
            # the confirmation is a query, which an evicted workflow answers after a replay:
            # on a loaded 2-core machine 20 at once took longer than the CLI's 10 s default
            return await fn(
                client,
                r["workflow_id"],
                r["step"],
                args_hash=r["args_hash"],
                by="tester",
                confirm_timeout=60,
            )

        results = await bounded(rows, decide)
        assert [res.outcome for res in results if not res.accepted] == []

        await until(lambda: client.count_workflows(running), lambda c: c.count == 0, "running")
        outcomes = await bounded(wids, lambda w: client.get_workflow_handle(w).result())
        for wid, [out] in zip(wids, outcomes, strict=True):
            if verdict[wid] == "approve":
                assert out["ok"]["amount"] == amount[wid], (wid, out)
            else:
                assert out["error"] == "ApprovalDenied", (wid, out)
        assert bank.count(to=who) == N // 2
        left = [r for r in await cli_list(server) if r["workflow_id"].startswith(prefix)]
        assert left == []
    finally:
        worker.stop()


class Base64Codec(PayloadCodec):
    """A payload codec (as for encryption): memos reach visibility encoded."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [
            Payload(
                metadata={"encoding": b"binary/b64"}, data=base64.b64encode(p.SerializeToString())
            )
            for p in payloads
        ]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [
            Payload.FromString(base64.b64decode(p.data))
            if p.metadata.get("encoding") == b"binary/b64"
            else p
            for p in payloads
        ]


async def test_list_pending_decodes_memos_through_the_clients_codec(client: Client) -> None:
    """Memos written through a payload codec are decoded by it; an empty memo lists nothing."""
    coded = Client(
        client.service_client,
        namespace=client.namespace,
        data_converter=dataclasses.replace(client.data_converter, payload_codec=Base64Codec()),
    )
    prefix = f"codec-{uuid.uuid4().hex[:8]}-"
    flag = TypedSearchAttributes([SearchAttributePair(PENDING_KEY, True)])
    now = datetime.now(UTC)

    def request(wid: str, n: int) -> dict[str, Any]:
        return {
            "workflow_id": wid,
            "step": "transfer#1",
            "tool": "transfer",
            "args": {"n": n},
            "args_hash": f"{n:064x}",
            "key": "k" * 64,
            "requested_at": now.isoformat(),
            "expires_at": (now + timedelta(hours=1)).isoformat(),
        }

    memos = {f"{prefix}{i}": [request(f"{prefix}{i}", i)] for i in range(3)}
    memos[f"{prefix}none"] = None  # published, then cleared: nothing pending
    handles = []
    try:
        for wid, memo in memos.items():  # no worker: the rows are what start_workflow wrote
            handles.append(
                await coded.start_workflow(
                    "NoSuchWorkflow",
                    id=wid,
                    task_queue=f"{prefix}nobody",
                    memo={approvals.PENDING_MEMO: memo},
                    search_attributes=flag,
                )
            )
        query = f"WorkflowId STARTS_WITH '{prefix}' AND {approvals.PENDING_ATTRIBUTE} = true"
        await until(lambda: client.count_workflows(query), lambda c: c.count == 4, "rows")
        listed = [r for r in await approvals.list_pending(coded) if r.workflow_id in memos]
        assert sorted((r.workflow_id, r.args) for r in listed) == [
            (f"{prefix}{i}", {"n": i}) for i in range(3)
        ]
    finally:
        for h in handles:
            await h.terminate("test over")


CACHE = 5


def live_instances(task_queue: str) -> int:
    gc.collect()
    return sum(
        1
        for o in gc.get_objects()
        if type(o).__name__ == "_WorkflowInstanceImpl" and o._info.task_queue == task_queue
    )


async def test_evicted_and_finished_workflows_are_freed(
    client: Client, bank: Bank, who: str
) -> None:
    tq = f"tq-{uuid.uuid4().hex[:12]}"
    worker = build_worker(client, tq, [Agent], max_cached_workflows=CACHE)
    async with worker:
        wids = [f"freed-{uuid.uuid4().hex[:8]}-{i}" for i in range(30)]
        for i, wid in enumerate(wids):
            p = plan(step("transfer", bank.url, i + 1, who))
            await client.start_workflow(Agent.run, p, id=wid, task_queue=tq)
        query = f"{approvals.PENDING_ATTRIBUTE} = true AND TaskQueue = '{tq}'"
        while (await client.count_workflows(query)).count < len(wids):
            await asyncio.sleep(0.2)
        assert live_instances(tq) <= CACHE + 1  # evicted ones are gone (bare Temporal: 5)
        for r in [r for r in await approvals.list_pending(client) if r.workflow_id in wids]:
            await approvals.deny(client, r.workflow_id, r.step, args_hash=r.args_hash, by="t")
        for wid in wids:
            await client.get_workflow_handle(wid).result()
        await asyncio.sleep(1.0)
        assert live_instances(tq) <= CACHE + 1  # and so are finished ones
