"""Regenerate the stored histories in tests/histories/ (run by hand after a deliberate change).

    python -m tests.make_histories

Each file is the JSON of one real run on the embedded server; tests/test_replay.py replays them
against the current code, so a change that breaks replay of a running workflow fails CI.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path

from exactcall.activities import Record
from temporalio.client import Client

from exactcall import Intent
from exactcall._server import DevServer
from exactcall._worker import Connection, connect
from exactcall.demo.bank import Bank
from tests.conftest import plan, running_worker, step
from tests.workflows import Agent, Rounds

HERE = Path(__file__).parent / "histories"


async def _save(client: Client, workflow_id: str, name: str, run_id: str | None = None) -> None:
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    (HERE / f"{name}.json").write_text(json.dumps(history.to_json_dict(), indent=1) + "\n")


async def main() -> None:
    with DevServer() as srv, tempfile.TemporaryDirectory() as tmp, Bank(Path(tmp) / "b.db") as bank:
        client = await connect(Connection(address=srv.address))
        async with running_worker(client, "histories"):
            calls = plan(
                step("pay", bank.url, 10, "alice"),
                step("pay", bank.url, 10, "alice", key="second-payment"),
                step("balance", bank.url, "alice"),
                step("pay", bank.url, "ten", "alice"),
            )
            h = await client.start_workflow(
                Agent.run, calls, id="hist-plain", task_queue="histories"
            )
            await h.result()
            await _save(client, h.id, "plain_call")
            h2 = await client.start_workflow(
                Rounds.run, args=[bank.url, "bob", 3, []], id="hist-can", task_queue="histories"
            )
            await h2.result()
            await _save(client, h2.id, "continue_as_new_first", run_id=h2.run_id)
            await _save(client, h2.id, "continue_as_new_last")
            # the per-key record of the first payment
            hist = await h.fetch_history()
            intent_payload = next(
                e.activity_task_scheduled_event_attributes.input.payloads
                for e in hist.events
                if e.HasField("activity_task_scheduled_event_attributes")
            )
            [intent] = await client.data_converter.decode(intent_payload, [Intent])
            rec = Record(client, intent)
            await _save(client, rec.id, "call_record")
    os._exit(0)


if __name__ == "__main__":
    asyncio.run(main())
