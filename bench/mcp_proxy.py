"""What ``exactcall mcp proxy`` costs a write, against calling the MCP server directly.

    python bench/mcp_proxy.py               # 50 writes per mode (~30 s)
    python bench/mcp_proxy.py --n 200 --block 10
    python bench/mcp_proxy.py --transport url     # a Streamable HTTP server (proxy --url)
    python bench/mcp_proxy.py --transport serve   # an HTTP client (exactcall mcp serve)

Two real stdio sessions of the MCP SDK's client, open side by side on one machine in one run:

* **direct**: ``python bench/_mcp_server.py DIRECT_FILE``;
* **proxied**: ``python -m exactcall mcp proxy -- python bench/_mcp_server.py PROXIED_FILE``,
  on the proxy's embedded Temporal dev server (a fresh ``EXACTCALL_HOME``, no
  ``TEMPORAL_*`` in its environment), every write guarded (``append`` has no read hint).

``--transport url``: the server speaks Streamable HTTP; **direct** is the SDK's HTTP client
to it, **proxied** a stdio session with ``exactcall mcp proxy --url`` in front of a second
one. ``--transport serve``: the client speaks HTTP; **direct** as for ``url``, **proxied**
the HTTP client to ``exactcall mcp serve -- python bench/_mcp_server.py FILE``.

After a warm-up, ``--n`` sequential ``append`` writes per mode with distinct arguments,
interleaved in ABBA blocks of ``--block``, then the same for the read ``count()`` (which the
proxy passes through). Per call: the time from ``call_tool`` to its result. Printed: p50, p95,
mean per mode, the proxied/direct ratio and the absolute overhead (proxied - direct) of the
p50s; then the effects counted at each destination (every write exactly once, with the
proxy's derived key). Nothing is asserted on time. JSON goes to ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SERVER = str(HERE / "_mcp_server.py")


@contextlib.asynccontextmanager
async def session(argv: list[str], env: dict[str, str], log: Path) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=sys.executable, args=argv, env=env, cwd=ROOT)
    with log.open("a") as err:
        async with Client(stdio_client(params, errlog=err), read_timeout_seconds=60) as client:
            yield client


@contextlib.asynccontextmanager
async def http_session(url: str) -> AsyncIterator[Client]:
    async with Client(streamable_http_client(url), read_timeout_seconds=60) as client:
        yield client


@contextlib.contextmanager
def process(argv: list[str], env: dict[str, str], log: Path, port: int) -> Any:
    """A server process listening on ``port`` (an HTTP MCP server, or ``mcp serve``)."""
    from exactcall.embedded._server import port_open

    with log.open("a") as err:
        proc = subprocess.Popen([sys.executable, *argv], env=env, cwd=ROOT, stdout=err, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while not port_open("127.0.0.1", port):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{argv} did not listen on {port}: see {log}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def timed(client: Client, tool: str, arguments: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    result = await client.call_tool(tool, arguments)
    ms = (time.perf_counter() - t0) * 1000
    if result.is_error:
        text = " ".join(getattr(c, "text", "") for c in result.content)
        raise RuntimeError(f"{tool}({arguments}) failed: {text}")
    return ms


async def rounds(
    clients: dict[str, Client], tool: str, n: int, block: int, tag: str
) -> dict[str, list[float]]:
    """``n`` calls per mode, in ABBA blocks; distinct arguments for every write."""
    times: dict[str, list[float]] = {m: [] for m in clients}
    order = list(clients)
    i = 0
    while min(len(v) for v in times.values()) < n:
        for mode in order:
            for _ in range(min(block, n - len(times[mode]))):
                args = {"text": f"{tag}-{mode}-{i}"} if tool == "append" else {}
                times[mode].append(await timed(clients[mode], tool, args))
                i += 1
        order.reverse()
    return times


def stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
        "mean": statistics.fmean(ordered),
    }


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="exactcall-bench-mcp-"))
    try:
        return await measure(args, work)
    finally:  # the proxy stopped its embedded server as its session closed
        shutil.rmtree(work, ignore_errors=True)


async def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    files = {"direct": work / "direct.jsonl", "proxied": work / "proxied.jsonl"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env.update(EXACTCALL_HOME=str(work / "home"), PYTHONUNBUFFERED="1")
    proxy = ["-m", "exactcall", "mcp", "proxy", "--name", "bench", "--audit", str(work / "a")]
    argv = {
        "direct": [SERVER, str(files["direct"])],
        "proxied": [*proxy, "--", sys.executable, SERVER, str(files["proxied"])],
    }
    async with contextlib.AsyncExitStack() as stack:
        if args.transport == "stdio":
            clients = {
                m: await stack.enter_async_context(session(argv[m], env, work / f"{m}.log"))
                for m in argv
            }
        else:
            from exactcall.embedded._server import free_port

            def listening(argv: Any, name: str) -> str:
                """Start ``argv(port)`` on a free port; its URL."""
                port = free_port()
                log = work / f"{name}.log"
                return stack.enter_context(process(argv(str(port)), env, log, port))

            def http_server(file: Path) -> Any:
                return lambda port: [SERVER, str(file), port]

            direct_url = listening(http_server(files["direct"]), "direct")
            direct = await stack.enter_async_context(http_session(direct_url))
            if args.transport == "url":
                upstream = listening(http_server(files["proxied"]), "upstream")
                via = [*proxy, "--url", upstream]
                proxied = await stack.enter_async_context(session(via, env, work / "proxied.log"))
            else:
                flags = [*proxy[4:], "--", sys.executable, SERVER, str(files["proxied"])]
                endpoint = listening(
                    lambda port: ["-m", "exactcall", "mcp", "serve", "--port", port, *flags],
                    "serve",
                )
                proxied = await stack.enter_async_context(http_session(endpoint))
            clients = {"direct": direct, "proxied": proxied}
        t0 = time.perf_counter()
        await timed(clients["proxied"], "append", {"text": "first"})  # starts the server
        first_ms = (time.perf_counter() - t0) * 1000
        await timed(clients["direct"], "append", {"text": "first"})
        await rounds(clients, "append", args.warmup, args.block, "warmup")
        writes = await rounds(clients, "append", args.n, args.block, "w")
        reads = await rounds(clients, "count", args.n, args.block, "r")
    expected = 1 + args.warmup + args.n
    found = {m: lines(p) for m, p in files.items()}
    texts = {m: [r["text"] for r in rows] for m, rows in found.items()}
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "load_avg": os.getloadavg(),
        "n": args.n,
        "block": args.block,
        "transport": args.transport,
        "first_proxied_write_ms": first_ms,
        "writes": {m: stats(v) for m, v in writes.items()},
        "reads": {m: stats(v) for m, v in reads.items()},
        "raw": {"writes": writes, "reads": reads},
        "effects": {
            m: {
                "lines": len(rows),
                "expected": expected,
                "distinct": len(set(texts[m])),
                "with_key": sum(1 for r in rows if r.get("key")),
            }
            for m, rows in found.items()
        },
    }


def report(r: dict[str, Any]) -> None:
    print(
        f"exactcall mcp proxy vs direct ({r['transport']}), {r['n']} sequential calls per mode, "
        f"ABBA blocks of {r['block']}, load {r['load_avg'][0]:.2f}"
    )
    print(f"first proxied write (starts the embedded server): {r['first_proxied_write_ms']:.0f} ms")
    print(f"{'':8} {'mode':8} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8}")
    for kind in ("writes", "reads"):
        for mode, s in r[kind].items():
            print(f"{kind:8} {mode:8} {s['p50']:8.2f} {s['p95']:8.2f} {s['mean']:8.2f}")
        d, p = r[kind]["direct"]["p50"], r[kind]["proxied"]["p50"]
        print(f"{kind:8} {'overhead':8} {p - d:8.2f} ms p50, ratio {p / d:.1f}x")
    for mode, e in r["effects"].items():
        print(
            f"effects {mode}: {e['lines']} lines for {e['expected']} writes, "
            f"{e['distinct']} distinct, {e['with_key']} with an exactcall key"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="calls per mode (writes, then reads)")
    parser.add_argument("--block", type=int, default=5, help="ABBA block size")
    parser.add_argument("--warmup", type=int, default=10, help="warm-up writes per mode")
    parser.add_argument("--json", type=Path, default=None, help="where to write the raw numbers")
    parser.add_argument(
        "--transport",
        choices=("stdio", "url", "serve"),
        default="stdio",
        help="stdio (default); url: an HTTP server (proxy --url); serve: an HTTP client",
    )
    ns = parser.parse_args()
    result = asyncio.run(main(ns))
    report(result)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = ns.json or HERE / "results" / f"mcp-proxy-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"raw numbers: {out}")
    sys.exit(
        0
        if all(e["lines"] == e["expected"] == e["distinct"] for e in result["effects"].values())
        else 1
    )
