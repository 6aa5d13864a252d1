"""Starting interactive runs and reading their workflow messages through the storage API."""

from __future__ import annotations

from typing import Any

from pi_workflows.client.start_request import start_payload
from pi_workflows.storage.workflow_messages import session_messages
from tests.host.conftest import HostHarness

SESSION = "session-terminal-tests"


def start_interactive(
    harness: HostHarness, workflow: str, input: Any = None, *, session: str = SESSION
) -> str:
    """What `run start WORKFLOW --session SESSION` sends, from this process (faster).

    An interactive run with an origin session; the CLI path is covered elsewhere.
    """
    payload = start_payload(workflow, harness.project, input, session_id=session)
    client = harness.client()
    try:
        return client.start_run(payload)["runId"]
    finally:
        client.close()


def messages(harness: HostHarness, session: str = SESSION) -> list[dict[str, Any]]:
    """Every workflow message of `session`, in order (`session messages --json` shape)."""
    store = harness.open_store()
    try:
        return session_messages(session)
    finally:
        store.close()


def terminal_messages(harness: HostHarness, run_id: str) -> list[dict[str, Any]]:
    return [
        message
        for message in messages(harness, _session_of(harness, run_id))
        if message["kind"] == "terminal" and message["runId"] == run_id
    ]


def _session_of(harness: HostHarness, run_id: str) -> str:
    rows = harness.query("SELECT origin_session_id FROM runs WHERE run_id = ?", run_id)
    return rows[0][0] if rows and rows[0][0] else SESSION


def terminal_message_count(harness: HostHarness, run_id: str) -> int:
    rows = harness.query(
        "SELECT COUNT(*) FROM workflow_messages WHERE run_id = ? AND kind = 'terminal'", run_id
    )
    return rows[0][0]
