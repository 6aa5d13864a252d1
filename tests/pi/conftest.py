"""Fixtures of the offline Pi test bed: a scripted model server, a Pi home, `pi --mode rpc`.

- `model_server`: a started `ScriptedModelServer` (tests/pi/model_server.py); script its
  replies with `model_server.script(...)`, assert on `model_server.requests`.
- `pi_home`: a `PiHome` (tests/pi/offline_pi.py) wired to `model_server`; `pi_home.env` is
  the environment for any `pi` child, `pi_home.model` its `--model` argument.
- `pi_bin`: the path of the real `pi` (fails loudly when `npm ci` has not run).
- `pi_rpc`: a factory `pi_rpc(extra_args=None, env=None) -> PiRpc` whose children are all
  closed (process group SIGTERM/SIGKILL) when the test ends.
- `pi_host`: a real host whose headless runs do their agent steps on the real pi (`PiHost`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.host.conftest import HostHarness, harness  # noqa: F401  (the fixture, re-exported)
from tests.pi.model_server import ScriptedModelServer
from tests.pi.offline_pi import PiHome, PiRpc, pi_executable


class PiHost:
    """A `HostHarness` whose host and CLI see the offline Pi home and the `pi` executor."""

    def __init__(self, host: HostHarness, pi_home: PiHome) -> None:
        self.harness = host
        self.pi_home = pi_home
        host.env.update(pi_home.env)
        host.env.update(
            {"PI_WORKFLOWS_AGENT_EXECUTOR": "pi", "PI_WORKFLOWS_PI_MODEL": pi_home.model}
        )

    def start_headless(self, workflow: str, input: Any = None) -> str:
        """`pi-workflows run start WORKFLOW --headless`; returns the run id."""
        args = ["run", "start", workflow, "--headless", "--no-autostart"]
        args += ["--project", str(self.harness.project)]
        if input is not None:
            args += ["--input-json", json.dumps(input)]
        return self.harness.cli(*args).stdout.strip()


@pytest.fixture
def model_server() -> Iterator[ScriptedModelServer]:
    """A scripted OpenAI-compatible server on 127.0.0.1 for this test."""
    with ScriptedModelServer() as server:
        yield server


@pytest.fixture
def pi_bin() -> Path:
    """The real `pi` executable installed by `npm ci` in plugins/pi-workflows-pi."""
    return pi_executable()


@pytest.fixture
def pi_home(tmp_path: Path, model_server: ScriptedModelServer, pi_bin: Path) -> PiHome:
    """An offline Pi home (SPEC §16) whose only provider is `model_server`."""
    return PiHome(tmp_path / "pi", model_server)


@pytest.fixture
def pi_rpc(pi_home: PiHome) -> Iterator[Callable[..., PiRpc]]:
    """Start `pi --mode rpc --no-session` children on `pi_home`; all closed at teardown."""
    started: list[PiRpc] = []

    def start(extra_args: list[str] | None = None, env: dict[str, str] | None = None) -> PiRpc:
        child = PiRpc(pi_home, extra_args, env)
        started.append(child)
        return child

    yield start
    for child in started:
        child.close()


# --- a real host whose headless agent steps run on the real pi ------------------------------


@pytest.fixture
def pi_host(
    harness: HostHarness,  # noqa: F811
    model_server: ScriptedModelServer,
    pi_bin: Path,
) -> PiHost:
    """A started host (tests/host/conftest.py) with `PI_WORKFLOWS_AGENT_EXECUTOR=pi` and an
    offline Pi home on `model_server`; `pi_host.start_headless(workflow, input)` starts a run.
    """
    host = PiHost(harness, PiHome(harness.root / "pi", model_server))
    harness.start_host()
    return host
