"""A real host whose event loop runs in a thread of the test process: the in-process tier.

Everything but the host's own process is as real as :class:`~.host.WorkflowHost`'s: the
host listens on its Unix socket, writes its database (SQLite file or PostgreSQL), and
supervises real worker processes. What is saved is the start of a Python process per host
and per command (imports, plugin loading), which is most of what a short contract test
waits for: while the host runs, :meth:`run_cli` runs ``pi-workflows`` in this process too
(click's test runner), talking to the host over its socket as a command process would.
What is lost is a host process to kill, stop or signal: a test that needs that uses
:class:`~.host.WorkflowHost` and is marked ``integration``.

While the host runs, this process's environment *is* the home's ``env`` (the host, its
settings, its plugins and the workers it starts read it), the plugin manager holds the
plugins that environment names, and the host's log goes to ``<root>/host.log`` as a
subprocess host's does. :meth:`stop` puts all of it back.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import logging
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import plugins, settings
from ..home import DATABASE_ENV
from ..host.host_log import FORMAT, RepeatLimiter
from . import launcher
from .host import WorkflowHost
from .polling import wait_until

STOP_TIMEOUT_S = 30.0


class InProcessHost(WorkflowHost):
    """:class:`~.host.WorkflowHost` with the host's loop in a thread of this process."""

    def __init__(self, root: Path, *, entry_points: Iterable[str] = ()) -> None:
        super().__init__(root, entry_points=entry_points)
        self.host: Any = None  # the running `pi_workflows.host.runtime.Host`
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._saved_environ: dict[str, str] | None = None
        self._log_handler: logging.Handler | None = None
        self._added_paths: list[str] = []
        self._launcher: launcher.Launcher | None = None

    def start(self, **extra_env: str) -> None:  # type: ignore[override]
        """Start the host in a thread and return once it answers ``host.status``."""
        if self._thread is not None:
            if self._thread.is_alive():
                raise AssertionError("this in-process host is already running")
            self.stop()  # it stopped itself (`host stop`): put this process back first
        # Chosen in this process's own environment (`PI_WORKFLOWS_TEST_LAUNCHER`), before
        # it becomes the home's.
        self._launcher = launcher.shared_launcher()
        self._enter_environment({**self.env, **extra_env})
        self._started.clear()
        self._failure = None
        self._thread = threading.Thread(target=self._serve, name="piw-in-process-host")
        self._thread.start()
        self._started.wait(timeout=60)
        if self._failure is not None or not self._started.is_set():
            failure = self._failure
            self._thread.join(timeout=STOP_TIMEOUT_S)
            self._thread = None
            self._leave_environment()
            raise AssertionError(f"in-process host did not start: {failure!r}\n{self.host_log()}")
        wait_until(self._answers, what="the in-process host to answer")

    def _serve(self) -> None:
        from ..host.runtime import Host

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            # This process has threads, so the launcher forks the host's fork server-to-be
            # (as a host process forks its own) instead of the host starting a new one.
            host_settings = settings.resolve()
            standby = (
                self._launcher.fork_server_standby(os.environ, self.home.root)
                if self._launcher is not None and host_settings.switch("fork_server")
                else None
            )
            self.host = Host(
                self.home,
                os.environ.get(DATABASE_ENV) or None,
                host_settings=host_settings,
                fork_standby=standby,
            )
            await self.host.start()
            self._started.set()
            await self.host.stopped.wait()

        try:
            asyncio.run(main())
        except BaseException as error:  # reported by start(), or by stop() if it came later
            self._failure = error
        finally:
            self._started.set()

    def stop(self) -> None:
        """Stop the host as `host stop` does, wait for its thread, and restore this process."""
        thread = self._thread
        if thread is None:
            return
        if thread.is_alive() and self._loop is not None and self.host is not None:
            host = self.host
            self._loop.call_soon_threadsafe(lambda: host.spawn(host.stop()))
        thread.join(timeout=STOP_TIMEOUT_S)
        self._thread = None
        self.host = None
        self._loop = None
        self._leave_environment()
        if thread.is_alive():
            raise AssertionError(f"the in-process host did not stop:\n{self.host_log()}")

    def cleanup(self) -> None:
        self.stop()
        super().cleanup()

    # --- the command line, in this process while the host runs ----------------------

    def run_cli(
        self, *args: str, env: dict[str, str] | None = None, module: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """``pi-workflows ARGS``: in this process while the host runs, else a subprocess.

        A subprocess still runs it when the host is not running (this process's
        environment and plugins are not the home's then), with environment overrides
        (they would reach the host's thread too), and for ``state`` commands, which open
        the database in the command's process: here that would repoint the process-wide
        database the host's thread uses.
        """
        running = self._thread is not None and self._thread.is_alive()
        if not running or env or "state" in args:
            return super().run_cli(*args, env=env, module=module)
        return self._run_cli_here(args)

    def _run_cli_here(self, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        from click.testing import CliRunner

        from ..cli.main import cli

        # A fresh root group per command, as a new process has: the commands plugins
        # register come from the plugins loaded now, not from an earlier test's.
        group = copy.copy(cli)
        group.commands = {}
        group._plugin_commands_loaded = False
        previous = os.getcwd()
        os.chdir(self.project)  # the subprocess's working directory
        try:
            result = CliRunner().invoke(group, list(args), prog_name="pi-workflows")
        finally:
            os.chdir(previous)
        stderr = result.stderr
        if result.exc_info is not None and not isinstance(result.exception, SystemExit):
            stderr += "".join(traceback.format_exception(*result.exc_info))
        return subprocess.CompletedProcess(
            ["pi-workflows", *args], result.exit_code, result.stdout, stderr
        )

    # --- this process, as the host's ------------------------------------------------

    def _enter_environment(self, env: dict[str, str]) -> None:
        self._saved_environ = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        # What a host process would import from its PYTHONPATH (the modules `add_plugin`
        # writes, a test's own plugin directory) this process imports too, while it runs.
        for entry in env.get("PYTHONPATH", "").split(os.pathsep):
            if entry and entry not in sys.path:
                sys.path.insert(0, entry)
                self._added_paths.append(entry)
        importlib.invalidate_caches()
        plugins.reload()
        handler = logging.FileHandler(self.root / "host.log", encoding="utf-8")
        handler.setFormatter(logging.Formatter(FORMAT))
        handler.addFilter(RepeatLimiter())
        logger = logging.getLogger("pi_workflows")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        self._log_handler = handler

    def _leave_environment(self) -> None:
        if self._log_handler is not None:
            logger = logging.getLogger("pi_workflows")
            logger.removeHandler(self._log_handler)
            logger.setLevel(logging.NOTSET)
            self._log_handler.close()
            self._log_handler = None
        for entry in self._added_paths:
            sys.path.remove(entry)
            for name, module in list(sys.modules.items()):
                if (getattr(module, "__file__", None) or "").startswith(entry):
                    del sys.modules[name]  # the next host imports its own version afresh
        self._added_paths = []
        if self._saved_environ is not None:
            os.environ.clear()
            os.environ.update(self._saved_environ)
            self._saved_environ = None
        plugins.reload()
