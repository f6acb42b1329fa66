"""The inbox's test harness: the inbox as a real process, a real webhook receiver, and
headless Chromium (Debian's, never a downloaded one)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from exactcall._serve import ServedHTTP
from exactcall.embedded._server import free_port

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class Receiver(ServedHTTP):
    """A real local webhook receiver: keeps every JSON body POSTed to it; answers 500 to the
    first ``fail_first`` posts."""

    def __init__(self, fail_first: int = 0) -> None:
        self.host, self.port = "127.0.0.1", 0
        self.bodies: list[dict[str, Any]] = []
        self.posts = 0
        self.fail_first = fail_first

    def _make_server(self) -> ThreadingHTTPServer:
        me = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                me.posts += 1
                if me.posts <= me.fail_first:
                    self.send_response(500)
                else:
                    me.bodies.append(json.loads(body))
                    self.send_response(204)
                self.end_headers()

        return ThreadingHTTPServer((self.host, self.port), H)

    def events(self, workflow_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        return [
            b
            for b in self.bodies
            if b.get("workflow_id") == workflow_id and (kind is None or b["event"] == kind)
        ]


class InboxProcess:
    """``exactcall inbox`` as a child process."""

    def __init__(self, address: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "exactcall", "inbox", "--port", str(self.port)]
        cmd += ["--address", address, *args]
        fd, name = tempfile.mkstemp(prefix="inbox-", suffix=".log")
        os.close(fd)
        self.log = Path(name)
        with self.log.open("wb") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )

    def wait_ready(self, timeout: float = 30) -> InboxProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the inbox exited {self.proc.returncode}: {self.output()}")
            try:
                urllib.request.urlopen(self.url + "/login", timeout=1).read()
                return self
            except urllib.error.HTTPError:  # it answers (a proxy-mode inbox: 401)
                return self
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the inbox did not answer in {timeout}s: {self.output()}")

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.unlink(missing_ok=True)


@asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    """Debian's Chromium, headless, with a fresh profile; never a downloaded browser."""
    from playwright.async_api import async_playwright

    if not Path(CHROMIUM).exists():
        raise RuntimeError(
            f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium; "
            ".ci/run does). Never `playwright install`: these machines cannot download browsers"
        )

    async with async_playwright() as p:
        # launch() gives the browser a fresh temporary profile (user-data-dir) of its own
        browser = await p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            await browser.close()


async def login(browser: Any, inbox_url: str, token: str) -> Any:
    """A new browser context (its own cookies) signed in with ``token``; returns its page."""
    ctx = await browser.new_context(viewport={"width": 1100, "height": 640})
    page = await ctx.new_page()
    await page.goto(inbox_url + "/")
    assert page.url.endswith("/login"), page.url
    await page.fill("#token", token)
    await page.click("#login")
    await page.wait_for_selector("#me")
    return page
