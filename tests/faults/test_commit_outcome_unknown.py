"""The PostgreSQL connection drops at COMMIT: the host cannot know whether its change
committed (issue 30, item 1).

The host reaches a real PostgreSQL server through a TCP proxy of the test's own
(`commit_cut.CommitCutProxy`), which cuts the host's connection exactly at the COMMIT of
one chosen transaction: either after the server committed it (the answer is lost) or
before it got the COMMIT (the server rolls back). The host sees the same thing both
times. It must read again and reconcile: no run started or executed twice, no node run
twice, no message lost, no half-written state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from pi_workflows.client.start_request import start_payload
from pi_workflows.event_types import EventType
from pi_workflows.testing import installed_entry_points, short_temp_dir, wait_until
from tests.faults.commit_cut import CommitCutProxy, Cut
from tests.host.conftest import HostHarness
from tests.host.workflows import LOAD

pytestmark = pytest.mark.integration

WHEN = pytest.mark.parametrize("when", ["after", "before"])
# Well inside the run claim lease (30 s): a run the host lost track of would wait for it.
RECONCILED_WITHIN_S = 15.0


@pytest.fixture
def proxy(postgres_server) -> Iterator[CommitCutProxy]:
    proxy = CommitCutProxy(postgres_server.host, postgres_server.port)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def harness(postgres_server, proxy) -> Iterator[HostHarness]:
    url = postgres_server.create_database(from_template=True)
    through_proxy = url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
    harness = HostHarness(short_temp_dir(), through_proxy, entry_points=installed_entry_points())
    harness.write_workflow("load", LOAD)
    try:
        yield harness
    finally:
        harness.cleanup()


def _trace(harness: HostHarness) -> Counter[str]:
    path = harness.project / "load-trace"
    return Counter(path.read_text().splitlines() if path.exists() else [])


def _was_cut(harness: HostHarness, cut: Cut) -> None:
    assert cut.done.wait(30), f"no transaction ran {cut.trigger!r}; host log:\n{harness.host_log()}"
    wait_until(
        lambda: "database connection restored" in harness.host_log(),
        what="the host to reconnect",
    )


def _ran_once_each(harness: HostHarness, n: int) -> None:
    assert _trace(harness) == Counter({f"{n} a": 1, f"{n} b": 1, f"{n} c": 1})


@WHEN
def test_a_run_start_whose_commit_is_cut_starts_one_run(harness, proxy, when):
    harness.start_host()
    cut = proxy.arm("'run.start'", when)
    client = harness.client()
    try:
        answer = client.start_run(start_payload("load", harness.project, {"n": 7}))
    finally:
        client.close()
    _was_cut(harness, cut)

    # The client got one answer naming one run, and that is the only run there is.
    assert harness.query("SELECT run_id FROM runs") == [(answer["runId"],)]
    assert harness.query("SELECT count(*) FROM host_commands WHERE operation = 'run.start'") == [
        (1,)
    ]
    assert harness.wait_for_run(answer["runId"])["status"] == "completed"
    _ran_once_each(harness, 7)


@WHEN
def test_a_claim_whose_commit_is_cut_runs_the_run_once_without_waiting_for_its_lease(
    harness, proxy, when
):
    harness.start_host()
    cut = proxy.arm(f"'{EventType.LEASE_CLAIMED}'", when)
    run_id = harness.start_run("load", {"n": 3})
    _was_cut(harness, cut)

    assert harness.wait_for_run(run_id, timeout=RECONCILED_WITHIN_S)["status"] == "completed"
    _ran_once_each(harness, 3)


@WHEN
def test_a_worker_write_whose_commit_is_cut_loses_no_message(harness, proxy, when):
    """The commit that ends the run is cut: the worker's write is answered once (asked
    again, it is adopted or applied, never both), and the run's origin session still gets
    its one terminal message."""
    harness.start_host()
    cut = proxy.arm(f"'{EventType.RUN_COMPLETED}'", when)
    run_id = harness.start_run("load", {"n": 5}, session="session-cut")
    _was_cut(harness, cut)

    assert harness.wait_for_run(run_id, timeout=RECONCILED_WITHIN_S)["status"] == "completed"
    _ran_once_each(harness, 5)
    message = harness.wait_for_message("session-cut", run_id)
    assert message["kind"] == "terminal"
    terminal = [m for m in harness.session_messages("session-cut") if m["kind"] == "terminal"]
    assert len(terminal) == 1
    assert harness.query(
        "SELECT count(*) FROM events WHERE run_id = ? AND event_type = ?",
        run_id,
        EventType.RUN_COMPLETED,
    ) == [(1,)]
