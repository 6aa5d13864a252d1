"""Fixtures of the Pi session tests: a host harness and `pi_session` (a `WorkflowPi`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.host.conftest import HostHarness, harness  # noqa: F401
from tests.pi.model_server import ScriptedModelServer
from tests.pi.offline_pi import PiHome
from tests.pi.session.relay import Relay, cli_shim
from tests.pi.session.workflow_pi import WorkflowPi


@pytest.fixture
def pi_session(
    harness: HostHarness,  # noqa: F811
    pi_home: PiHome,
    model_server: ScriptedModelServer,
) -> Iterator[WorkflowPi]:
    harness.start_host()
    bed = WorkflowPi(harness, pi_home, model_server)
    try:
        yield bed
    finally:
        bed.close()


@pytest.fixture
def relay(pi_session: WorkflowPi) -> Iterator[Relay]:
    """A relay in front of the harness host; `pi_session.start(..., PI_WORKFLOWS_CLI=relay.cli)`."""
    root = pi_session.harness.root
    wire = Relay(root / "relay.sock", pi_session.harness.home.socket_path)
    wire.cli = str(cli_shim(root / "relay-cli", wire))
    try:
        yield wire
    finally:
        wire.close()
