"""A deliberately changed Agent, to show that replay catches an incompatible change."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import exactcall


@workflow.defn(name="Agent")
class AgentWithExtraLookup:
    """Looks the balance up before every plan: a new activity in front of the old ones."""

    @workflow.run
    async def run(self, plan: dict[str, Any]) -> list[dict[str, Any]]:
        first = plan["steps"][0]
        await exactcall.call("balance", first["args"][0], "audit")
        return [
            {"ok": await exactcall.call(s["tool"], *s["args"], key=s.get("key"))}
            for s in plan["steps"]
        ]


@workflow.defn(name="Agent")
class AgentPaysOneMore:
    """Same commands, other arguments: Temporal's replay passes, the intents do not."""

    @workflow.run
    async def run(self, plan: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for s in plan["steps"]:
            args = [a + 1 if isinstance(a, int) else a for a in s["args"]]
            try:
                out.append({"ok": await exactcall.call(s["tool"], *args, key=s.get("key"))})
            except exactcall.ExactcallError as err:
                out.append({"error": err.code})
        return out
