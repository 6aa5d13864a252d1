"""One `pi --mode rpc` child: its own process group, and the JSON-lines RPC protocol.

Commands go to pi's stdin, one JSON object per LF-terminated line; pi answers each with a
`{"type": "response", "id": ...}` line and streams every other event (agent, message, tool
events) on stdout. Lines are split on LF only, as Pi's RPC documentation requires.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from pi_workflows.plugin import start_registered, unregister

KILL_GRACE_SECONDS = 3.0
STDERR_TAIL_BYTES = 16 * 1024


class PiProcessError(Exception):
    """pi exited, or did not answer a command in time."""


class PiWaitStopped(Exception):
    """The caller's `should_stop` said to stop waiting for pi's answer."""


class PiProcess:
    """A running `pi --mode rpc`; `events` is a queue of everything pi sends but responses."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
        self.argv = argv
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._responses: dict[str, queue.Queue[dict[str, Any]]] = {}
        self._stderr: deque[bytes] = deque()
        self._stderr_bytes = 0
        self._write_lock = threading.Lock()
        # Its own process group, registered with the host before pi runs (SPEC §7.4a), so
        # the host can end it if the worker cannot.
        self.process = start_registered(
            argv,
            kind="agent",
            keep_stdin=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
        )
        self._readers = [
            threading.Thread(target=self._read_stdout, name="pi-rpc-stdout", daemon=True),
            threading.Thread(target=self._read_stderr, name="pi-rpc-stderr", daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def is_running(self) -> bool:
        return self.process.poll() is None

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.rstrip(b"\n").rstrip(b"\r")
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                continue  # not protocol: pi writes only JSON lines on stdout in RPC mode
            if not isinstance(message, dict):
                continue
            waiter = (
                self._responses.get(message.get("id"))
                if message.get("type") == "response"
                else None
            )
            if waiter is not None:
                waiter.put(message)
            else:
                self.events.put(message)
        self.events.put({"type": "_exited"})

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for chunk in iter(lambda: self.process.stderr.read1(4096), b""):
            self._stderr.append(chunk)
            self._stderr_bytes += len(chunk)
            while self._stderr_bytes > STDERR_TAIL_BYTES and len(self._stderr) > 1:
                self._stderr_bytes -= len(self._stderr.popleft())

    def stderr_tail(self) -> str:
        """The last lines pi wrote on stderr (at most 16 KiB)."""
        return b"".join(self._stderr).decode(errors="replace")

    def write(self, command: dict[str, Any]) -> None:
        """Send one command without waiting for its response."""
        assert self.process.stdin is not None
        data = json.dumps(command).encode() + b"\n"
        try:
            with self._write_lock:
                self.process.stdin.write(data)
                self.process.stdin.flush()
        except (BrokenPipeError, ValueError) as error:
            raise PiProcessError(self.exit_description()) from error

    def send(
        self,
        command: dict[str, Any],
        timeout: float,
        should_stop: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        """Send a command and wait for its response (PiProcessError on exit or timeout,
        PiWaitStopped as soon as `should_stop()` is true)."""
        request_id = f"piw-{uuid.uuid4().hex[:12]}"
        answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self._responses[request_id] = answers
        try:
            self.write({**command, "id": request_id})
            waited = 0.0
            while True:
                try:
                    return answers.get(timeout=0.1)
                except queue.Empty:
                    waited += 0.1
                if should_stop is not None and should_stop():
                    raise PiWaitStopped(command.get("type"))
                if not self.is_running:
                    raise PiProcessError(self.exit_description())
                if waited >= timeout:
                    raise PiProcessError(
                        f"pi did not answer {command.get('type')!r} within {timeout:.0f} s"
                    )
        finally:
            self._responses.pop(request_id, None)

    def exit_description(self) -> str:
        """`pi exited with code N: <last stderr line>` (or that it is still running)."""
        code = self.process.poll()
        lines = [line for line in self.stderr_tail().splitlines() if line.strip()]
        last = f": {lines[-1].strip()[:300]}" if lines else ""
        if code is None:
            return f"pi stopped answering{last}"
        return f"pi exited with code {code}{last}"

    def terminate(self) -> None:
        """End pi's process group: SIGTERM (pi ends the commands it started), SIGKILL after 3 s."""
        if self.is_running:
            _signal_group(self.pid, signal.SIGTERM)
            try:
                self.process.wait(KILL_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.pid, signal.SIGKILL)
        self.process.wait()
        unregister(self.process)
        for reader in self._readers:
            reader.join(timeout=1.0)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                try:
                    stream.close()
                except BrokenPipeError:
                    pass  # stdin still held a command pi exited before reading


def _signal_group(process_group: int, signum: int) -> None:
    try:
        os.killpg(process_group, signum)
    except (ProcessLookupError, PermissionError):
        pass
