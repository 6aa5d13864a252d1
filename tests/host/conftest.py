"""A real host process on a private short home, plus helpers to drive and inspect it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows.client import WorkflowClient
from pi_workflows.home import CONFIG_ENV, DATABASE_ENV, HOME_ENV, Home
from pi_workflows.host.lock import live_lock_holder
from tests.polling import wait_until

FAST_TIMERS = {
    "PI_WORKFLOWS_POLL_S": "0.1",
    "PI_WORKFLOWS_HEARTBEAT_S": "0.5",
}


class HostHarness:
    """A short home (Unix socket paths are limited), a project dir and the host's env."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = Home(root / "h")
        self.project = root / "project"
        (self.project / ".pi" / "workflows").mkdir(parents=True)
        self.config = root / "config"
        self.config.mkdir(mode=0o700)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PI_WORKFLOWS_")}
        env.update({HOME_ENV: str(self.home.root), CONFIG_ENV: str(self.config), **FAST_TIMERS})
        env["PYTHONUNBUFFERED"] = "1"
        self.env = env
        self.host_process: subprocess.Popen | None = None

    # --- processes ---------------------------------------------------------------------

    def start_host(self, **extra_env: str) -> subprocess.Popen:
        """`pi-workflows host run` in the foreground, as a child we can signal."""
        log = open(self.root / "host.log", "ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "pi_workflows", "host", "run"],
            env={**self.env, **extra_env},
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            cwd=self.project,
        )
        log.close()
        self.host_process = process
        wait_until(
            lambda: self.home.socket_path.exists() or process.poll() is not None,
            what="the host socket",
        )
        if process.poll() is not None:
            raise AssertionError(f"host exited early:\n{self.host_log()}")
        wait_until(self._answers, what="the host to answer")
        return process

    def _answers(self) -> bool:
        try:
            WorkflowClient(self.home, autostart=False).host_status()
        except Exception:
            return False
        return True

    def host_log(self) -> str:
        path = self.root / "host.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def cli(self, *args: str, check: bool = True, **extra_env: str) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-m", "pi_workflows", *args],
            env={**self.env, **extra_env},
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            cwd=self.project,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"pi-workflows {' '.join(args)} exited {result.returncode}\n"
                f"stdout: {result.stdout}\nstderr: {result.stderr}\nhost log:\n{self.host_log()}"
            )
        return result

    def wait_for_pid(self, filename: str, previous: int | None = None) -> int:
        """The worker pid a test workflow wrote to `<project>/<filename>` (a new one)."""
        path = self.project / filename

        def read() -> int | None:
            text = path.read_text() if path.exists() else ""
            return int(text) if text and int(text) != previous else None

        return wait_until(read, what=f"a worker pid in {filename}")

    def client(self) -> WorkflowClient:
        return WorkflowClient(self.home, autostart=False)

    def write_workflow(self, name: str, source: str) -> Path:
        path = self.project / ".pi" / "workflows" / f"{name}.workflow.py"
        path.write_text(textwrap.dedent(source))
        return path

    def start_run(self, workflow: str, input: Any = None) -> str:
        args = ["run", "start", workflow, "--project", str(self.project), "--no-autostart"]
        if input is not None:
            args += ["--input-json", json.dumps(input)]
        return self.cli(*args).stdout.strip()

    def wait_for_status(self, run_id: str, *statuses: str, timeout: float = 30.0) -> dict:
        client = self.client()
        try:
            return wait_until(
                lambda: (s := client.run_status(run_id))["status"] in statuses and s,
                timeout=timeout,
                what=f"run {run_id} to reach {statuses}",
            )
        except AssertionError:
            raise AssertionError(
                f"run {run_id} is {client.run_status(run_id)}; host log:\n{self.host_log()}"
            ) from None
        finally:
            client.close()

    # --- inspection --------------------------------------------------------------------

    def query(self, sql: str, *params: Any) -> list[tuple]:
        """Read the state database directly (read-only, alongside the live host)."""
        conn = sqlite3.connect(f"file:{self.home.database_path}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def workers(self, run_id: str) -> list[tuple[int, str, int | None]]:
        return self.query(
            "SELECT generation, status, pid FROM run_workers WHERE run_id = ? ORDER BY generation",
            run_id,
        )

    def stop(self) -> None:
        process = self.host_process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        holder = live_lock_holder(self.home.lock_path)
        if holder is not None:
            _kill_tree(holder["pid"])


def _kill_tree(pid: int) -> None:
    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    for child in parent.children(recursive=True):
        child.kill()
    parent.kill()


@pytest.fixture
def harness() -> Iterator[HostHarness]:
    root = Path(tempfile.mkdtemp(prefix="piw-", dir="/tmp"))
    os.chmod(root, 0o700)
    harness = HostHarness(root)
    try:
        yield harness
    finally:
        harness.stop()
        _reap_workers(root)
        shutil.rmtree(root, ignore_errors=True)


def _reap_workers(root: Path) -> None:
    """Kill worker processes a crashed host left behind (their cwd is the project)."""
    project = str(root / "project")
    for process in psutil.process_iter(["pid", "cwd"]):
        try:
            if process.info["cwd"] and process.info["cwd"].startswith(project):
                process.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


__all__ = ["DATABASE_ENV", "HostHarness", "wait_until"]
