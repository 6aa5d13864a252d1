"""A private pi-workflows home, and a real host running in one.

Everything is real: the host is ``python -m pi_workflows host run`` in a subprocess, it
listens on a Unix socket and writes a real SQLite file, workers are real processes. The
home lives in a short directory under ``/tmp`` because a Unix socket path must fit in
about a hundred bytes, which pytest's own temporary paths can exceed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from ..client import WorkflowClient
from ..errors import RunWaitTimedOut
from ..home import CONFIG_ENV, HOME_ENV, Home
from ..host.lock import live_lock_holder
from ..plugins import PLUGINS_ENV
from . import launcher
from .isolation import clean_environ, isolating_env
from .launcher import LaunchedProcess
from .polling import wait_until
from .scratch import memory_dir

# Short timers so a test waits milliseconds, not the production seconds, for a poll. The
# poll is 0.2 s, not 0.1: the suite keeps hundreds of hosts up, and this halves what their
# idle polls (and their PostgreSQL backends') cost (docs/performance.md).
FAST_TIMERS = {"PI_WORKFLOWS_POLL_S": "0.2", "PI_WORKFLOWS_HEARTBEAT_S": "0.5"}
TERMINAL_STATUSES = ("completed", "failed", "timed_out", "cancelled")
CLI_TIMEOUT_S = 120
# A host niced on a loaded 2-core machine can take well over the usual second to listen.
HOST_START_TIMEOUT_S = 90.0


def short_temp_dir() -> Path:
    """A new private directory with a short path (room for ``<dir>/h/host/host.sock``), in
    memory when the machine has room (see :mod:`pi_workflows.testing.scratch`)."""
    base = memory_dir() or tempfile.gettempdir()
    if len(base) > 40:
        base = "/tmp"
    root = Path(tempfile.mkdtemp(prefix="piw-", dir=base)).resolve()
    os.chmod(root, 0o700)
    return root


class WorkflowHome:
    """A private state home, config dir and project dir, and the environment naming them.

    ``env`` is the complete environment of every process started from here (change it
    before starting them): no inherited ``PI_WORKFLOWS_*`` variable, installed entry-point
    plugins disabled except ``entry_points``, and the modules written with
    :meth:`add_plugin` loaded through ``PI_WORKFLOWS_PLUGINS``.
    """

    def __init__(self, root: Path, *, entry_points: Iterable[str] = ()) -> None:
        self.root = root
        self.home = Home(root / "h")
        self.config_dir = root / "config"
        self.config_dir.mkdir(mode=0o700, exist_ok=True)
        self.project = root / "project"
        (self.project / ".pi" / "workflows").mkdir(parents=True, exist_ok=True)
        self.plugin_dir = root / "plugins"
        self._entry_points = list(entry_points)
        self._plugin_modules: list[str] = []
        self.env = {
            **clean_environ(),
            HOME_ENV: str(self.home.root),
            CONFIG_ENV: str(self.config_dir),
            "PYTHONUNBUFFERED": "1",
        }
        self._isolate()

    def _isolate(self) -> None:
        self.env.pop(PLUGINS_ENV, None)
        self.env.update(isolating_env(self._entry_points, self._plugin_modules))

    def use_entry_points(self, *names: str) -> None:
        """Let the installed entry-point plugins `names` load (they are disabled otherwise)."""
        self._entry_points.extend(names)
        self._isolate()  # an unknown name fails here, not later in the host

    def add_plugin(self, module_name: str, source: str) -> Path:
        """Write a plugin module and load it in every process started from now on.

        The module goes to a directory put on the subprocesses' ``PYTHONPATH`` and is
        named in ``PI_WORKFLOWS_PLUGINS``, the way a user loads a local one-off plugin.
        """
        self.plugin_dir.mkdir(mode=0o700, exist_ok=True)
        path = self.plugin_dir / f"{module_name}.py"
        path.write_text(textwrap.dedent(source))
        if module_name not in self._plugin_modules:
            self._plugin_modules.append(module_name)
            path_entries = self.env.get("PYTHONPATH", "").split(os.pathsep)
            if str(self.plugin_dir) not in path_entries:
                self.env["PYTHONPATH"] = os.pathsep.join(
                    p for p in (str(self.plugin_dir), *path_entries) if p
                )
            self._isolate()
        return path

    def write_workflow(self, name: str, source: str) -> Path:
        """Write ``<project>/.pi/workflows/<name>.workflow.py``."""
        path = self.project / ".pi" / "workflows" / f"{name}.workflow.py"
        path.write_text(textwrap.dedent(source))
        return path

    def run_cli(
        self, *args: str, env: dict[str, str] | None = None, module: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """``pi-workflows ARGS`` in a subprocess, unchecked: inspect ``returncode`` yourself.

        The console script next to this interpreter runs it, or ``python -m pi_workflows``
        with ``module=True``.
        """
        return launcher.run(
            args,
            env={**self.env, **(env or {})},
            cwd=self.project,
            module=module,
            timeout=CLI_TIMEOUT_S,
        )

    def host_log(self) -> str:
        """What the host wrote (the foreground host of :class:`WorkflowHost`, or autostart's)."""
        parts = []
        for path in (self.root / "host.log", self.home.logs_dir / "host.log"):
            if path.exists():
                parts.append(path.read_text(errors="replace"))
        return "".join(parts)

    def query(self, sql: str, *params: Any) -> list[tuple]:
        """Read the SQLite state database directly (read-only, beside a live host)."""
        uri = f"file:{self.home.database_path}?mode=ro"
        connection = sqlite3.connect(uri, uri=True, timeout=5)
        try:
            return connection.execute(sql, params).fetchall()
        finally:
            connection.close()

    def cleanup(self) -> None:
        """Kill any host of this home and its workers, then delete the directory."""
        holder = live_lock_holder(self.home.lock_path) if self.home.host_dir.exists() else None
        if holder is not None:
            _kill_tree(holder["pid"])
        _kill_processes_in(self.project)
        shutil.rmtree(self.root, ignore_errors=True)


class WorkflowHost(WorkflowHome):
    """A real host (``pi-workflows host run``) in a private home, as a child process.

    Write workflows and plugins first, then :meth:`start`; drive it with :meth:`cli`,
    :meth:`client` and :meth:`start_run`; wait with :meth:`wait_for_status`.
    """

    def __init__(self, root: Path, *, entry_points: Iterable[str] = ()) -> None:
        super().__init__(root, entry_points=entry_points)
        self.env.update(FAST_TIMERS)
        self.host_process: LaunchedProcess | subprocess.Popen[bytes] | None = None
        self.host_as_child = False

    # --- the host process ------------------------------------------------------------

    def start(
        self, *, timeout: float = HOST_START_TIMEOUT_S, **extra_env: str
    ) -> LaunchedProcess | subprocess.Popen[bytes]:
        """Start the host and return once it answers ``host.status`` (within `timeout` s).

        The host is forked from the test kit's launcher (`testing/launcher.py`), or, with
        `host_as_child` set, exec'd as a child of this process: for a test that leaves it
        unreaped.
        """
        with open(self.root / "host.log", "ab") as log:
            process = launcher.start(
                ["host", "run"],
                env={**self.env, **extra_env},
                cwd=self.project,
                log=log,
                child=self.host_as_child,
            )
        self.host_process = process
        wait_until(
            lambda: self.home.socket_path.exists() or process.poll() is not None,
            timeout=timeout,
            what="the host socket",
        )
        if process.poll() is not None:
            raise AssertionError(f"host exited early:\n{self.host_log()}")
        wait_until(self._answers, timeout=timeout, what="the host to answer")
        return process

    def _answers(self) -> bool:
        try:
            self.status()
        except Exception:
            return False
        return True

    def stop(self) -> None:
        """SIGTERM the host and wait (killing it, and a host it left, after 15 s)."""
        process = self.host_process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        holder = live_lock_holder(self.home.lock_path) if self.home.host_dir.exists() else None
        if holder is not None:
            _kill_tree(holder["pid"])

    def cleanup(self) -> None:
        self.stop()
        super().cleanup()

    # --- driving it ------------------------------------------------------------------

    def client(self) -> WorkflowClient:
        """A client of this host (never starts one); close it when done."""
        return WorkflowClient(self.home, autostart=False)

    def status(self) -> dict[str, Any]:
        """The host's ``host status --json`` object."""
        client = self.client()
        try:
            return client.host_status()
        finally:
            client.close()

    def cli(self, *args: str, check: bool = True, **extra_env: str) -> subprocess.CompletedProcess:
        """``python -m pi_workflows ARGS``; with `check`, a failure raises with the host log."""
        result = self.run_cli(*args, env=extra_env, module=True)
        if check and result.returncode != 0:
            raise AssertionError(
                f"pi-workflows {' '.join(args)} exited {result.returncode}\n"
                f"stdout: {result.stdout}\nstderr: {result.stderr}\nhost log:\n{self.host_log()}"
            )
        return result

    def start_run(
        self,
        workflow: str,
        input: Any = None,
        *,
        session: str | None = None,
        args: Iterable[str] = (),
    ) -> str:
        """``run start WORKFLOW`` in the project (interactive with `session`); the run id."""
        command = ["run", "start", workflow, "--project", str(self.project), "--no-autostart"]
        if input is not None:
            command += ["--input-json", json.dumps(input)]
        if session is not None:
            command += ["--session", session]
        return self.cli(*command, *args).stdout.strip()

    def wait_for_status(self, run_id: str, *statuses: str, timeout: float = 30.0) -> dict:
        """Wait until the run has one of `statuses`; its status object.

        The host pushes each change of the run's status (the client's `wait_for_run`),
        so the wait costs no poll: on two cores, polls would compete with the host.
        """
        client = self.client()
        try:
            return client.wait_for_run(
                run_id, timeout_s=timeout, until=lambda s: s["status"] in statuses
            )
        except RunWaitTimedOut:
            raise AssertionError(
                f"run {run_id} is {client.run_status(run_id)}; host log:\n{self.host_log()}"
            ) from None
        finally:
            client.close()

    def session_messages(self, session: str) -> list[dict[str, Any]]:
        """``session messages SESSION --json``: the session's workflow messages, in order."""
        return json.loads(self.cli("session", "messages", session, "--json").stdout)

    def wait_for_message(self, session: str, run_id: str, kind: str = "terminal") -> dict:
        """Wait for the run's first workflow message of `kind` in `session`; return it."""
        return wait_until(
            lambda: next(
                (
                    message
                    for message in self.session_messages(session)
                    if message["runId"] == run_id and message["kind"] == kind
                ),
                None,
            ),
            what=f"a {kind} message of run {run_id} in session {session}",
        )

    def wait_for_run(self, run_id: str, timeout: float = 30.0) -> dict:
        """Wait until the run is terminal (completed, failed, timed out or cancelled)."""
        return self.wait_for_status(run_id, *TERMINAL_STATUSES, timeout=timeout)


def _kill_tree(pid: int) -> None:
    if pid == os.getpid():
        return  # an in-process host's lock names this process: it is stopped, not killed
    try:
        parent = psutil.Process(pid)
        children = parent.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    # A host that is stopping ends its workers as this walks them: one already gone is fine.
    for process in (*children, parent):
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue


def _kill_processes_in(directory: Path) -> None:
    """Kill workers a crashed host left behind (their working directory is the project),
    or a fork server still on its way out, and wait until they are gone: the directory is
    deleted next, and a test may unmount the filesystem it is on."""
    prefix = str(directory)
    killed = []
    for process in psutil.process_iter(["pid", "cwd"]):
        try:
            if process.info["cwd"] and process.info["cwd"].startswith(prefix):
                process.kill()
                killed.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    psutil.wait_procs(killed, timeout=10)
