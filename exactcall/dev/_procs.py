"""Worker processes and an effect counter that survive SIGKILL (no pytest needed).

Used by the test kit (:mod:`exactcall.testing`), ``exactcall demo``, ``exactcall quickstart``,
``exactcall crashtest`` and the benches. A production worker imports none of this.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from exactcall._crash import CRASH_ENV, CRASH_PLUGIN

__all__ = ["EFFECTS_ENV", "EffectCounter", "WorkerProcess", "record_effect"]

EFFECTS_ENV = "EXACTCALL_EFFECTS_FILE"


def record_effect(name: str) -> None:
    """Count one real execution of ``name`` (no-op unless a test set EXACTCALL_EFFECTS_FILE).

    One ``O_APPEND`` write per effect: it survives a SIGKILL right after it returns.
    """
    path = os.environ.get(EFFECTS_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (name + "\n").encode())
    finally:
        os.close(fd)


class EffectCounter:
    """Reads what ``record_effect`` wrote (from this process and worker processes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def count(self, name: str | None = None) -> int:
        lines = self.path.read_text().splitlines()
        return len(lines) if name is None else sum(1 for n in lines if n == name)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.path.read_text().splitlines():
            out[n] = out.get(n, 0) + 1
        return out


class WorkerProcess:
    """``exactcall worker`` in a child process, optionally SIGKILLing itself at a crash point."""

    def __init__(
        self,
        address: str,
        task_queue: str,
        *,
        tools: Sequence[str] = (),
        workflows: Sequence[str] = (),
        crash_at: str | None = None,
        namespace: str = "default",
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        sticky_timeout: float = 1.0,
        name: str = "worker",
        args: Sequence[str] = (),
        inherit_env: bool = True,
        plugins: Sequence[str] = (),
        arm_crash_points: bool | None = None,
    ) -> None:
        """``args``: more ``exactcall worker`` flags (e.g. TLS); ``inherit_env=False``: ``env``
        is the whole environment (plus what the worker needs here); ``plugins``:
        ``MODULE:NAME`` of more Temporal plugins (``exactcall worker --plugin``);
        ``arm_crash_points``: add exactcall's CrashPlugin, without which ``EXACTCALL_CRASH_AT``
        does nothing (default: when this worker has a crash rule, from ``crash_at`` or
        ``env``)."""
        self.name = name
        base = dict(os.environ) if inherit_env else {}
        base.pop(CRASH_ENV, None)  # only this worker's own crash rule applies
        full_env = {**base, **(env or {})}
        full_env["EXACTCALL_LOG_LEVEL"] = "INFO"  # started() waits for the worker.started line
        if crash_at:
            full_env[CRASH_ENV] = crash_at
        if arm_crash_points is None:
            arm_crash_points = bool(full_env.get(CRASH_ENV))
        cwd = Path(cwd or os.getcwd())
        full_env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(cwd), full_env.get("PYTHONPATH", "")])
        )
        cmd = [
            sys.executable,
            "-m",
            "exactcall",
            "worker",
            "--address",
            address,
            "--namespace",
            namespace,
            "--task-queue",
            task_queue,
            "--sticky-timeout",
            str(sticky_timeout),
            *args,
        ]
        for t in tools:
            cmd += ["--tools", t]
        for w in workflows:
            cmd += ["--workflows", w]
        for pl in plugins:
            cmd += ["--plugin", pl]
        if arm_crash_points:
            cmd += ["--plugin", CRASH_PLUGIN]
        self.proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C is the caller's to handle: it kills the workers
        )
        self.log: list[str] = []
        self._started = threading.Event()
        self._eof = threading.Event()
        threading.Thread(
            target=self._read_stderr, name=f"exactcall-{name}-stderr", daemon=True
        ).start()

    @property
    def tail(self) -> list[str]:
        """The last lines the worker logged."""
        return [line.rstrip() for line in self.log[-20:] if line.strip()]

    async def started(self, timeout: float = 60) -> WorkerProcess:
        """Wait for the worker's ``worker.started`` line (its stderr is read by a thread of its
        own, so any number of workers can start at once)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self._started.is_set():
            if self._eof.is_set() and self.proc.poll() is not None:
                raise RuntimeError(
                    f"worker exited with {self.proc.returncode}: {''.join(self.log)[-2000:]}"
                )
            if loop.time() > deadline:
                raise TimeoutError(f"worker did not start within {timeout:.0f} s")
            await asyncio.sleep(0.02)
        return self

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        try:
            for line in iter(self.proc.stderr.readline, b""):
                self.log.append(line.decode(errors="replace"))
                if not self._started.is_set() and b"worker.started" in line:
                    self._started.set()
                del self.log[:-500]
        except (OSError, ValueError):  # closed by stop()
            pass
        finally:
            self._eof.set()

    async def killed(self, timeout: float = 120) -> int:
        """Wait until the process died (its crash point SIGKILLs it); its return code."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (code := self.proc.poll()) is None:
            if loop.time() > deadline:
                raise TimeoutError(f"worker {self.name} still alive after {timeout:.0f} s")
            await asyncio.sleep(0.02)
        return code

    def kill(self) -> None:
        """SIGKILL it now (a crash at an arbitrary moment)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def freeze(self) -> None:
        """SIGSTOP its process group: alive, but it runs nothing (a GC pause, a frozen VM)."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT its process group: it runs again, its clocks moved on."""
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.kill()
        if self.proc.stderr:
            self.proc.stderr.close()
