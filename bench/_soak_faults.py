"""The faults of ``bench/soak.py --faults ...``, injected at random on a seed.

Every few seconds (``SoakConfig.kill_every``) one fault of the enabled kinds strikes, the
first ones one of each kind in a shuffled order (so a short soak has them all), then at
random:

* ``worker``: SIGKILL of a random worker, restarted at once;
* ``freeze``: SIGSTOP of a worker's process group, SIGCONT ``hold`` seconds later;
* ``partition``: the worker's link to the frontend blackholed for ``hold`` seconds;
* ``server``: SIGKILL of the dev server, restarted on its database file 0.5-2 s later;

with ``hold`` drawn between 1.5 and 3 heartbeat timeouts, so the server times the attempt out
and a successor looks while the old one is paused or cut off. ``provider`` is drawn per call
instead: a share of the calls pay through a :class:`TimedChaos` proxy in front of the bank,
which lets the payment be booked and then loses the response (the connection closed without
an answer, or a 502), the first time each distinct payment is sent. A worker that stops
itself (exactcall's fail-stop) is restarted by the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench._fleet import Fleet
from bench._soak_count import Fault
from exactcall.dev._chaos import WRITE_METHODS, ChaosProxy
from exactcall.testing import DevServer

KINDS = ("worker", "freeze", "partition", "server", "provider")
HELD = ("freeze", "partition")


def parse_faults(text: str) -> tuple[str, ...]:
    """``worker,freeze,...`` (or ``all``) as a tuple of kinds; a clear error otherwise."""
    kinds = KINDS if text.strip() == "all" else tuple(k.strip() for k in text.split(",") if k)
    wrong = [k for k in kinds if k not in KINDS]
    if wrong or not kinds:
        raise ValueError(
            f"--faults: {', '.join(wrong) or 'nothing'} is not a fault; give a comma-separated "
            f"list of {', '.join(KINDS)} (or all)"
        )
    return kinds


class TimedChaos(ChaosProxy):
    """The chaos proxy of ``exactcall chaos``, noting when it lost which payment's response."""

    def __init__(self, upstream: str, fault: str) -> None:
        super().__init__(upstream, fault=fault)
        self.lost: list[Fault] = []

    def _exchange(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> Any:
        reply = super()._exchange(method, target, headers, body)
        if method in WRITE_METHODS and (reply is None or reply.status == 502):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                pay = json.loads(body)
                call = (str(pay["to"]), int(pay["amount"]))
                self.lost.append(Fault("provider", time.time(), detail=self.fault, call=call))
        return reply


@dataclass
class Routes:
    """Which calls pay through a chaos proxy: ``share`` of them, on a seed; at least one
    of each proxy's faults when there are enough calls."""

    proxies: Sequence[TimedChaos]
    share: float
    seed: int
    drawn: dict[tuple[int, int], str] = field(default_factory=dict)

    def job(self, i: int, bank: str, calls: int) -> dict[str, str]:
        """``banks`` of run ``i``'s job: amount -> the URL its payment goes to."""
        rng = random.Random(f"{self.seed}-{i}")
        out = {}
        for amount in range(1, calls + 1):
            forced = i == 0 and amount <= len(self.proxies)  # one of each, at the first run
            if self.proxies and (forced or rng.random() < self.share):
                k = amount - 1 if forced else rng.randrange(len(self.proxies))
                out[str(amount)] = self.proxies[k].url
                self.drawn[(i, amount)] = self.proxies[k].fault
        return {a: out.get(a, bank) for a in map(str, range(1, calls + 1))}

    def faults(self) -> list[Fault]:
        return [f for p in self.proxies for f in p.lost]


@dataclass
class Injector:
    """Strikes the fleet (and the server) with faults of ``kinds`` until stopped."""

    fleet: Fleet
    server: DevServer | None
    kinds: Sequence[str]
    every: tuple[float, float]
    heartbeat: float
    rng: random.Random
    faults: list[Fault] = field(default_factory=list)
    server_up: asyncio.Event = field(default_factory=asyncio.Event)
    on_server_start: Callable[[int | None], None] = lambda pid: None
    """Told the restarted server's pid (the bench's watchdog)."""
    limit: float = float("inf")
    """At most this many faults (besides the provider's), then none."""
    count: int = 0

    def __post_init__(self) -> None:
        self.server_up.set()
        kinds = [k for k in self.kinds if k != "provider"]
        if "server" in kinds and (self.server is None or self.server.db is None):
            raise ValueError(
                "the server fault needs the soak's own dev server on a database file "
                "(not --address): it is SIGKILLed and restarted on that file"
            )
        self.first = self.rng.sample(kinds, len(kinds))
        self.cycle = kinds

    async def loop(self, stop: asyncio.Event) -> None:
        lo, hi = self.every
        tasks: set[asyncio.Task[None]] = set()
        while not stop.is_set() and self.cycle and self.count < self.limit:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.uniform(lo, hi))
                break
            self.fleet.reap()
            kind = self.first.pop(0) if self.first else self.rng.choice(self.cycle)
            self.count += 1
            if kind == "server":
                if self.server_up.is_set():
                    task = asyncio.ensure_future(self.server_outage())
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                continue
            await self.server_up.wait()  # (a worker fault while the server is down: after)
            if kind == "worker":
                self.fleet.kill_one(self.rng)
            else:
                self.fleet.hold_one(kind, self.rng, self.rng.uniform(1.5, 3) * self.heartbeat)
        await asyncio.gather(*tasks)
        await self.server_up.wait()

    async def server_outage(self) -> None:
        """SIGKILL the dev server, restart it on its database file a moment later."""
        assert self.server is not None
        self.server_up.clear()
        fault = Fault("server", time.time(), pid=self.server.pid)
        self.faults.append(fault)
        try:
            await asyncio.to_thread(self.server.kill)
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))
            await asyncio.to_thread(self.server.restart)
            fault.until = time.time()
            self.on_server_start(self.server.pid)
        finally:
            self.server_up.set()
