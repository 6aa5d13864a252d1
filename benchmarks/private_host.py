"""A private host for the benchmark scripts: a new home in a temporary directory, a host
started there as a user runs it, and everything removed again afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pi_workflows.client import WorkflowClient
from pi_workflows.home import Home


@dataclass
class BenchHost:
    root: Path
    home: Home
    project: Path
    env: dict[str, str]  # the host's environment (none of this shell's PI_WORKFLOWS_)
    process: subprocess.Popen = field(init=False)
    client: WorkflowClient = field(init=False)


def start_host(home: Home, env: dict[str, str]) -> subprocess.Popen:
    """`pi-workflows host run` in `home`, once it answers `host status`."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pi_workflows", "--home", str(home.root), "host", "run"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            WorkflowClient(home, autostart=False).host_status()
            return process
        except Exception:
            time.sleep(0.05)
    raise SystemExit("host did not start")


def private_home(prefix: str) -> tuple[Path, Home, Path, dict[str, str]]:
    """A new private directory with a home and a project in it, and the environment of a
    host there (none of this shell's PI_WORKFLOWS_ settings)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o700)
    project = root / "project"
    project.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PI_WORKFLOWS_")}
    env["PI_WORKFLOWS_CONFIG_DIR"] = str(root / "config")
    return root, Home(root / "home"), project, env


@contextlib.contextmanager
def private_host(
    prefix: str, prepare: Callable[[BenchHost], None] | None = None, **env: str
) -> Iterator[BenchHost]:
    """A host in a new private home, with `env` added to its environment and `prepare`
    (seeding, plugin files) done before it starts; yields it with a client. On the way
    out the client closes, the host stops and the directory goes; after a failure the
    host log's last lines are printed first."""
    root, home, project, host_env = private_home(prefix)
    bench = BenchHost(root, home, project, {**host_env, **env})
    try:
        if prepare is not None:
            prepare(bench)
        bench.process = start_host(home, bench.env)
        bench.client = WorkflowClient(home, autostart=False)
        try:
            yield bench
        except BaseException:
            log = home.logs_dir / "host.log"
            if log.exists():
                print("host log (last lines):", *log.read_text().splitlines()[-30:], sep="\n")
            raise
        finally:
            bench.client.close()
            bench.process.terminate()
            bench.process.wait(timeout=30)
    finally:
        shutil.rmtree(root, ignore_errors=True)
