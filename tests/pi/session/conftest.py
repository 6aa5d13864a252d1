"""Fixtures of the Pi session tests: a host harness and `pi_session` (a `WorkflowPi`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.host.conftest import HostHarness, harness  # noqa: F401
from tests.pi.model_server import ScriptedModelServer
from tests.pi.offline_pi import PiHome
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
