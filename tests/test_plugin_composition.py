"""exactcall.Plugin() next to each agent framework's Temporal plugin, in either order.

Every pair is connected for real and runs an exactcall call through a worker built from that
client: the framework's payload converter carries exactcall's intents and records. The agent
runs themselves (a model turn after the tool) are in each framework's own test file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from pydantic_ai.durable_exec.temporal._payload_converter import PydanticAIPayloadConverter
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    PayloadCodec,
)
from temporalio.langgraph import LangGraphPlugin
from temporalio.openai_agents import OpenAIAgentsPlugin, OpenAIPayloadConverter
from temporalio.openai_agents.testing import ResponseBuilders, TestModel, TestModelProvider

import exactcall
from exactcall._converter import ModelsAsPydantic
from exactcall._plugin import carries_pydantic, choose_data_converter
from exactcall.approvals import Decision
from exactcall.embedded._server import DevServer
from tests.conftest import plan, running_worker, start_agent, step


def _openai() -> OpenAIAgentsPlugin:
    # no model runs here (the calls come from a plain workflow); no API key is needed either
    model = TestModel(lambda: ResponseBuilders.output_message("unused"))
    return OpenAIAgentsPlugin(model_provider=TestModelProvider(model))


FRAMEWORKS: dict[str, tuple[Callable[[], Any], type]] = {
    "openai-agents": (_openai, OpenAIPayloadConverter),
    "pydantic-ai": (PydanticAIPlugin, PydanticAIPayloadConverter),
    "langgraph": (lambda: LangGraphPlugin(graphs={}), ModelsAsPydantic),
}


@pytest.mark.parametrize("exactcall_first", [True, False], ids=["exactcall-first", "it-first"])
@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
async def test_composes_in_either_order_and_calls_run(
    server: DevServer, tq: str, bank: Any, who: str, framework: str, exactcall_first: bool
) -> None:
    make, converter_class = FRAMEWORKS[framework]
    plugins = [exactcall.Plugin(), make()]
    if not exactcall_first:
        plugins.reverse()
    client = await Client.connect(server.address, plugins=plugins)
    # the framework's own converter is kept (never silently replaced by plain pydantic)
    assert issubclass(client.data_converter.payload_converter_class, converter_class)
    async with running_worker(client, tq):
        out = await (await start_agent(client, tq, plan(step("pay", bank.url, 10, who)))).result()
    assert out[0]["ok"]["amount"] == 10, out
    assert bank.count(to=who) == 1


def test_pydantic_capable_converters_are_kept_as_they_are() -> None:
    for cls in (PydanticPayloadConverter, PydanticAIPayloadConverter, OpenAIPayloadConverter):
        conv = DataConverter(payload_converter_class=cls)
        assert carries_pydantic(conv)
        assert choose_data_converter(conv) is conv


class _PassThroughCodec(PayloadCodec):
    async def encode(self, payloads: Any) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Any) -> list[Payload]:
        return list(payloads)


def test_the_default_converter_is_wrapped_and_keeps_the_codec() -> None:
    codec = _PassThroughCodec()
    chosen = choose_data_converter(dataclasses.replace(DataConverter.default, payload_codec=codec))
    assert issubclass(chosen.payload_converter_class, ModelsAsPydantic)
    assert chosen.payload_converter_class.inner_class is DefaultPayloadConverter
    assert chosen.payload_codec is codec
    assert choose_data_converter(None).payload_converter_class is chosen.payload_converter_class
    conv = chosen.payload_converter
    # a dict is the default converter's (sorted keys); a model is pydantic JSON
    [d, m] = conv.to_payloads(
        [{"b": 1, "a": 2}, Decision(decision="approve", args_hash="h", by="ops")]
    )
    assert d.data == DataConverter.default.payload_converter.to_payloads([{"b": 1, "a": 2}])[0].data
    assert (
        m.data
        == pydantic_data_converter.payload_converter.to_payloads(
            [Decision(decision="approve", args_hash="h", by="ops")]
        )[0].data
    )
    assert conv.from_payloads([m], [Decision]) == [
        Decision(decision="approve", args_hash="h", by="ops")
    ]
    assert conv.from_payloads([d], [dict]) == [{"a": 2, "b": 1}]


def test_the_default_is_left_for_a_later_plugin_that_insists_on_its_own() -> None:
    chosen = choose_data_converter(DataConverter.default, [OpenAIAgentsPlugin()])
    assert chosen is DataConverter.default  # OpenAIAgentsPlugin replaces it next


class _PlainJSON(CompositePayloadConverter):
    """Temporal's default encodings under another name: cannot carry pydantic models."""

    def __init__(self) -> None:
        super().__init__(*DefaultPayloadConverter.default_encoding_payload_converters)


def test_a_converter_that_cannot_carry_pydantic_models_is_wrapped() -> None:
    conv = DataConverter(payload_converter_class=_PlainJSON)
    assert not carries_pydantic(conv)
    chosen = choose_data_converter(conv)
    assert carries_pydantic(chosen) and chosen.payload_converter_class.inner_class is _PlainJSON
    assert choose_data_converter(chosen) is chosen  # once


def test_the_core_imports_no_integration() -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    probe = (
        "import sys\n"
        "import exactcall, exactcall.approvals, exactcall.reconciliation, exactcall.testing\n"
        "import exactcall.demo.run, exactcall.quickstart.run, exactcall.dev._doctor\n"
        "from exactcall.cli._main import _parser\n"
        "_parser()\n"
        "exactcall.Plugin()\n"
        "top = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(top & {'agents', 'openai', 'pydantic_ai', 'langgraph', 'langchain_core',"
        " 'mcp', 'mcp_types'}))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert run.stdout.strip() == "[]", run.stdout
