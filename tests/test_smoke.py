from tests.conftest import plan, start_agent, step


async def test_smoke(client, worker, tq, bank, who):
    h = await start_agent(client, tq, plan(step("pay", bank.url, 10, who)))
    out = await h.result()
    assert out[0]["ok"]["amount"] == 10, out
    assert bank.count(to=who) == 1
