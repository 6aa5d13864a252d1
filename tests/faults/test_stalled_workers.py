"""Workers of a stalled host fence themselves (issue 30, item 5, PostgreSQL half).

Two real hosts share a real PostgreSQL database. One is SIGSTOPped while its worker runs
a shell node; the other takes the run over once the stopped host's lease has run out and
runs that node again. The stopped host's worker must have stopped the node's command
before that, so each command's side effect (a line appended to a file) happens once.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator

import pytest

from pi_workflows.testing import installed_entry_points, short_temp_dir
from tests.host.conftest import HostHarness
from tests.polling import process_gone, wait_until

pytestmark = pytest.mark.integration

HOST_LEASE_MS = 6000  # long enough for a heartbeat on a loaded 2-core machine
TIMERS = {
    "PI_WORKFLOWS_HOST_LEASE_MS": str(HOST_LEASE_MS),
    "PI_WORKFLOWS_HEARTBEAT_S": "1",
    "PI_WORKFLOWS_POLL_S": "0.5",
}

# a → b → c, each a shell command that appends its node's name to <project>/effects when
# it is done; b first appends its shell's pid to <project>/b.pids and waits for
# <project>/release-b.
GATED_SHELLS = '''
from pi_workflows import edge, idempotent_effect, shell, workflow

GATE = """
echo $$ >> b.pids
while [ ! -e release-b ]; do sleep 0.05; done
"""


def step(node, gated=False):
    script = (GATE if gated else "") + f"echo {node} >> effects\\n"
    return shell(
        exec=lambda ctx: {"command": script, "shell": True}, effect=idempotent_effect(node)
    )


WORKFLOW = workflow(
    name="gated",
    start_at="a",
    nodes={"a": step("a"), "b": step("b", gated=True), "c": step("c")},
    edges=[edge("a", "b"), edge("b", "c")],
)
'''


@pytest.fixture
def hosts(postgres_url: str) -> Iterator[list[HostHarness]]:
    """Two homes pointed at one fresh PostgreSQL database (hosts not started yet)."""
    harnesses = []
    for _ in range(2):
        harness = HostHarness(short_temp_dir(), postgres_url, entry_points=installed_entry_points())
        harness.env.update(TIMERS)
        harnesses.append(harness)
    try:
        yield harnesses
    finally:
        for harness in harnesses:
            if harness.host_process is not None and harness.host_process.poll() is None:
                harness.host_process.send_signal(signal.SIGCONT)
            harness.cleanup()


def _lines(path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.mark.scenario("2.18")
def test_a_stalled_hosts_worker_stops_its_command_before_another_host_runs_it(hosts):
    stalled, taker = hosts
    stalled.write_workflow("gated", GATED_SHELLS)
    stalled.start_host()
    run_id = stalled.start_run("gated")
    pids = stalled.project / "b.pids"
    first = wait_until(lambda: _lines(pids), what="node b's command to start")[0]
    [(worker,)] = stalled.query("SELECT pid FROM run_workers WHERE run_id = ?", run_id)
    taker.start_host()

    stalled.host_process.send_signal(signal.SIGSTOP)
    # The taker runs node b again once the stalled host's lease has run out; by then the
    # stalled host's worker has stopped its own command of b.
    second = wait_until(lambda: _lines(pids)[1:], timeout=60, what="the taker to run node b")[0]
    assert process_gone(int(first)), "the stalled host's command of b still runs beside the taker's"
    assert process_gone(worker), "the stalled host's worker still runs beside the taker's"
    assert int(second) != int(first)

    (stalled.project / "release-b").touch()
    final = taker.wait_for_status(run_id, "completed", timeout=60)
    assert final["status"] == "completed"

    stalled.host_process.send_signal(signal.SIGCONT)
    wait_until(
        lambda: "took the host lease again" in stalled.host_log(),
        timeout=30,
        what="the stalled host to take its lease again",
    )
    assert stalled.host_process.poll() is None
    assert Counter(_lines(stalled.project / "effects")) == {"a": 1, "b": 1, "c": 1}
