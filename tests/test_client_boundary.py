"""Clients reach the state only through the host's socket, never the database (4.24)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.host.conftest import HostHarness, harness  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parent.parent
EXTENSION = REPO_ROOT / "plugins" / "pi-workflows-pi" / "piw_pi" / "extensions" / "session"

# A client starts a run, follows it and lists runs while an audit hook notes every SQLite
# connection and every open of a file of the state database.
CLIENT_WATCHED = """
import json
import sys
from pathlib import Path

touched = []


def audit(event, args):
    if event == "sqlite3.connect":
        touched.append(f"sqlite3.connect {args[0]}")
    elif event == "open" and isinstance(args[0], str) and "state.sqlite" in args[0]:
        touched.append(f"open {args[0]}")


sys.addaudithook(audit)

from pi_workflows.client import WorkflowClient
from pi_workflows.client.start_request import start_payload
from pi_workflows.home import Home

client = WorkflowClient(Home(Path(sys.argv[1])), autostart=False)
run_id = client.start_run(start_payload("hello", Path(sys.argv[2]), {"name": "socket"}))["runId"]
final = client.wait_for_run(run_id)
listed = [run["runId"] for run in client.list_runs()]
client.close()
print(json.dumps({"final": final, "listed": listed, "touched": touched}))
"""


@pytest.mark.scenario("4.24")
def test_a_client_works_through_the_socket_and_never_opens_the_database(
    harness: HostHarness,  # noqa: F811
):
    harness.start_host()
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            CLIENT_WATCHED,
            str(harness.home.root),
            str(harness.project),
        ],
        env=harness.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["final"]["status"] == "completed"
    assert answer["final"]["finalOutput"] == {"greeting": "Hello, socket!"}
    assert answer["touched"] == []
    assert answer["final"]["runId"] in answer["listed"]

    # The Pi extension (TypeScript) speaks only the socket protocol too.
    sources = sorted(EXTENSION.glob("*.ts"))
    assert sources
    for source in sources:
        text = source.read_text().lower()
        assert "sqlite" not in text and "state.sqlite" not in text, source.name
