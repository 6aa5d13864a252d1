"""The real `pi` binary, offline: its private home (SPEC §16) and a driver for `pi --mode rpc`.

- `pi_executable()` is the `pi` installed by `npm ci` in plugins/pi-workflows-pi (the test
  fails with the command to run when it is missing — it is never skipped).
- `PiHome` is a throwaway Pi home wired to a `ScriptedModelServer`: `HOME=<root>`,
  `PI_CODING_AGENT_DIR=<root>/agent` holding `models.json` (provider `scripted`, `"api":
  "openai-completions"`, the server's base URL) and `settings.json` (automatic retries off),
  and `PI_OFFLINE=1`. `home.env` is a complete environment for a `pi` child; `home.model`
  is the `--model` argument (`scripted/scripted-model`).
  `home.processes()` lists the live processes started with that environment.
- `PiRpc` runs `pi --mode rpc` in its own process group and speaks the RPC protocol (one JSON
  object per LF-terminated line): `send()` a command and get its response, read `events`,
  `wait_for()` an event, `close()` the whole group (SIGTERM, SIGKILL after 3 s). It starts
  the installed pi the way the `pi` executor does (`pi_on_bundled_node`: the Node `npm ci`
  put beside it, through the launcher with its caches, here one per test process) unless
  given a plain `pi` executable to run as is: the launcher changes what pi costs to start
  (about a third of the CPU), not what it does, and these tests start ~30 of them.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from piw_pi.node import BUNDLED_NODE, pi_on_bundled_node

from tests.pi.model_server import MODEL_ID, ScriptedModelServer

REPO_ROOT = Path(__file__).resolve().parents[2]
PI_PACKAGE_DIR = REPO_ROOT / "plugins" / "pi-workflows-pi"
PI_BIN = PI_PACKAGE_DIR / "node_modules" / ".bin" / "pi"
PROVIDER = "scripted"
KILL_GRACE_SECONDS = 3.0


def pi_executable() -> Path:
    """The `pi` of plugins/pi-workflows-pi/node_modules; fails the test loudly when absent."""
    if not PI_BIN.exists():
        pytest.fail(
            f"The Pi coding agent is not installed ({PI_BIN} is missing): run "
            "`(cd plugins/pi-workflows-pi && npm ci)` with Node >= 20 "
            "(README.md's first command does, through scripts/setup).",
            pytrace=False,
        )
    return PI_BIN


def bundled_node() -> Path:
    """The Node `npm ci` installs next to pi (Linux x64) and headless pi runs on; fails the
    test loudly when absent."""
    if not BUNDLED_NODE.exists():
        pytest.fail(
            f"The Node that pi runs on is not installed ({BUNDLED_NODE} is missing): run "
            "`(cd plugins/pi-workflows-pi && npm ci)` on Linux x64 "
            "(README.md's first command does, through scripts/setup).",
            pytrace=False,
        )
    return BUNDLED_NODE


_launcher_cache: str | None = None


def pi_launch_command() -> list[str]:
    """The installed pi on the bundled Node through the launcher, with caches this test
    process keeps (private, removed at exit) so that only its first pi starts cold."""
    global _launcher_cache
    pi_executable()
    bundled_node()
    if _launcher_cache is None:
        _launcher_cache = tempfile.mkdtemp(prefix="piw-test-pi-cache-")
        atexit.register(shutil.rmtree, _launcher_cache, True)
    command = pi_on_bundled_node(_launcher_cache)
    assert command is not None  # both halves were checked above
    return list(command)


class PiHome:
    """A private, offline Pi home whose only provider is the scripted model server.

    `extra_settings` are merged into settings.json; `retries_off=False` leaves Pi's automatic
    retries at their defaults (on), as a user's Pi has them. The directory layout::

        <root>/                 HOME
        <root>/agent/           PI_CODING_AGENT_DIR (models.json, settings.json)
        <root>/project/         a working directory for pi (cwd)
    """

    def __init__(
        self,
        root: Path,
        server: ScriptedModelServer,
        extra_settings: dict[str, Any] | None = None,
        retries_off: bool = True,
    ) -> None:
        self.root = root
        self.agent_dir = root / "agent"
        self.project = root / "project"
        self.server = server
        self.agent_dir.mkdir(parents=True, exist_ok=True)
        self.project.mkdir(exist_ok=True)
        self.write_models(server.base_url)
        settings: dict[str, Any] = {}
        if retries_off:
            settings["retry"] = {"enabled": False, "provider": {"maxRetries": 0}}
        settings.update(extra_settings or {})
        (self.agent_dir / "settings.json").write_text(json.dumps(settings, indent=2))

    def write_models(self, base_url: str) -> None:
        """(Re)write models.json so provider `scripted` points at `base_url`."""
        models = {
            "providers": {
                PROVIDER: {
                    "baseUrl": base_url,
                    "api": "openai-completions",
                    "apiKey": "offline-test-key",
                    "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                    "models": [{"id": MODEL_ID, "name": "Scripted test model"}],
                }
            }
        }
        (self.agent_dir / "models.json").write_text(json.dumps(models, indent=2))

    @property
    def model(self) -> str:
        """The `--model` argument selecting the scripted model."""
        return f"{PROVIDER}/{MODEL_ID}"

    @property
    def env(self) -> dict[str, str]:
        """A complete environment for a `pi` child: PATH plus the offline Pi variables only."""
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root),
            "PI_CODING_AGENT_DIR": str(self.agent_dir),
            "PI_OFFLINE": "1",
            "PI_SKIP_VERSION_CHECK": "1",
        }

    def processes(self) -> list[psutil.Process]:
        """Live non-Python processes with this home's environment: `pi` and what it started.

        Found by `PI_CODING_AGENT_DIR` in their environment, so it sees processes that are no
        longer anyone's child (an orphaned pi after its worker was killed). Python processes
        (a host, its workers, the CLI given the same environment) and zombies are left out.
        """
        found = []
        marker = str(self.agent_dir)
        for process in psutil.process_iter(["pid"]):
            try:
                if process.status() == psutil.STATUS_ZOMBIE:
                    continue
                if process.environ().get("PI_CODING_AGENT_DIR") != marker:
                    continue
                command = process.cmdline()
                if command and "python" not in os.path.basename(command[0]):
                    found.append(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found


class PiRpcError(AssertionError):
    """pi did not answer as the test expected (its stderr is in the message)."""


class PiRpc:
    """A `pi --mode rpc --no-session` child in its own process group.

    A reader thread decodes stdout lines; responses (`type: "response"`) are matched to
    `send()` calls by id, every other object lands in `events` (in order). stderr goes to
    `<home.root>/pi-stderr-<n>.log` and is quoted in failures.
    """

    def __init__(
        self,
        home: PiHome,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        executable: Path | None = None,
    ) -> None:
        self.home = home
        self.events: list[dict[str, Any]] = []
        self._responses: dict[str, queue.Queue[dict[str, Any]]] = {}
        self._changed = threading.Condition()
        self.stderr_path = home.root / f"pi-stderr-{uuid.uuid4().hex[:8]}.log"
        argv = [
            *([str(executable)] if executable is not None else pi_launch_command()),
            "--mode",
            "rpc",
            "--no-session",
            "--model",
            home.model,
            *(extra_args or []),
        ]
        with open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=home.project,
                env={**home.env, **(env or {})},
                start_new_session=True,
            )
        self._reader = threading.Thread(target=self._read, name="pi-rpc-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.rstrip(b"\n").rstrip(b"\r")
            if not line:
                continue
            try:
                message = json.loads(line)
            except ValueError:
                message = {"type": "_unparsed", "line": line.decode(errors="replace")}
            if message.get("type") == "response" and message.get("id") in self._responses:
                self._responses[message["id"]].put(message)
                continue
            with self._changed:
                self.events.append(message)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def write(self, command: dict[str, Any]) -> None:
        """Send one command line without waiting for its response."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command).encode() + b"\n")
        self.process.stdin.flush()

    def send(self, command: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        """Send a command and return its `response` object (PiRpcError on timeout)."""
        request_id = command.get("id") or f"req-{uuid.uuid4().hex[:8]}"
        answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self._responses[request_id] = answers
        try:
            self.write({**command, "id": request_id})
            try:
                return answers.get(timeout=timeout)
            except queue.Empty:
                raise PiRpcError(
                    f"pi sent no response to {command.get('type')!r} within {timeout}s; "
                    f"stderr:\n{self.stderr()}"
                ) from None
        finally:
            self._responses.pop(request_id, None)

    def prompt(self, message: str, timeout: float = 30.0) -> dict[str, Any]:
        """Send a `prompt` command; returns its (accepted) response."""
        response = self.send({"type": "prompt", "message": message}, timeout)
        if not response.get("success"):
            raise PiRpcError(f"pi refused the prompt: {response}")
        return response

    def wait_for(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = 30.0,
        after: int = 0,
        what: str = "an event",
    ) -> dict[str, Any]:
        """The first event from index `after` on that satisfies `predicate` (waits for it)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for event in self.events[after:]:
                    if predicate(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and not self._reader.is_alive()):
                    types = [event.get("type") for event in self.events[after:]]
                    raise PiRpcError(
                        f"pi did not produce {what} within {timeout}s (events: {types}); "
                        f"exit code {self.process.poll()}; stderr:\n{self.stderr()}"
                    )
                self._changed.wait(min(left, 0.2))

    def wait_for_type(self, event_type: str, timeout: float = 30.0, after: int = 0) -> dict:
        """The first event of `event_type` at or after index `after`."""
        return self.wait_for(
            lambda event: event.get("type") == event_type, timeout, after, repr(event_type)
        )

    def close(self) -> None:
        """End pi's whole process group: SIGTERM, then SIGKILL after 3 s."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(KILL_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._reader.join(timeout=5)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> PiRpc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
