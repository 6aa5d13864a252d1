"""Session tests: a real host, real socket clients acting as chat sessions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pi_workflows.client.session_client import SessionClient
from tests.host.conftest import HostHarness, harness, wait_until  # noqa: F401

# Two agent steps; the first one's validator insists on a list of findings.
TWO_STEPS = """
from pi_workflows import agent, compute, edge, workflow


def findings(output, ctx):
    if not isinstance(output, dict) or not isinstance(output.get("findings"), list):
        raise ValueError("output.findings must be a list")
    return output


WORKFLOW = workflow(
    name="two-steps",
    start_at="inspect",
    nodes={
        "inspect": agent("Inspect the project.", validate=findings),
        "draft": agent(lambda ctx: f"Draft a plan from {ctx.outputs['inspect']}."),
        "finish": compute(
            lambda ctx: {"plan": ctx.outputs["draft"], "found": ctx.outputs["inspect"]}
        ),
    },
    edges=[edge("inspect", "draft"), edge("draft", "finish")],
)
"""


class Sessions:
    """Opens session clients against the harness host and closes them afterwards."""

    def __init__(self, host: HostHarness) -> None:
        self.harness = host
        self.opened: list[SessionClient] = []

    def open(self, session_id: str, *, coordinator: bool = True) -> SessionClient:
        client = SessionClient(
            self.harness.home, session_id, autostart=False, coordinator=coordinator
        )
        client.open()
        self.opened.append(client)
        return client

    def start(self, workflow: str, session_id: str, input_json: str = "{}") -> str:
        result = self.harness.cli(
            "run",
            "start",
            workflow,
            "--session",
            session_id,
            "--input-json",
            input_json,
            "--project",
            str(self.harness.project),
            "--no-autostart",
        )
        return result.stdout.strip()

    def first_step(
        self, workflow: str, source: str, session_id: str
    ) -> tuple[str, SessionClient, dict]:
        """Start `source` from `session_id`; the run, its session and the step delivered."""
        self.harness.write_workflow(workflow, source)
        run_id = self.start(workflow, session_id)
        session = self.open(session_id)
        session.report_branch()
        return run_id, session, session.deliver_next()

    def close(self) -> None:
        for client in self.opened:
            client.close()


@pytest.fixture
def sessions(harness: HostHarness) -> Iterator[Sessions]:  # noqa: F811
    harness.write_workflow("two-steps", TWO_STEPS)
    harness.start_host()
    helper = Sessions(harness)
    try:
        yield helper
    finally:
        helper.close()
