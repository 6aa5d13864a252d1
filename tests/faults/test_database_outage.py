"""A PostgreSQL server that restarts or goes down under a live host (issue 30, item 1).

The server is a real cluster of the test's own (`postgres_cluster`), stopped and started
with `pg_ctl`; the host is a real `pi-workflows host run` process. The host must notice
the lost connection, say so, reconnect on its own and carry on: no run stranded, no node
run twice, no request left hanging, and `host stop` / SIGTERM working throughout.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from pi_workflows.client.start_request import start_payload
from pi_workflows.testing import installed_entry_points, short_temp_dir, wait_until
from tests.host.conftest import HostHarness
from tests.host.workflows import LOAD

pytestmark = pytest.mark.integration

# The load workflow (a → b → c, each node noting "<n> <node>" in <project>/load-trace; b a
# managed effect that takes a moment): a server restart finds runs in flight.
RUNS = 12
# A bound on anything the host is asked while its database is down: an answer, not a hang.
ANSWER_WITHIN_S = 10.0


@pytest.fixture
def harness(postgres_cluster) -> Iterator[HostHarness]:
    url = postgres_cluster.server.create_database()
    harness = HostHarness(short_temp_dir(), url, entry_points=installed_entry_points())
    harness.write_workflow("load", LOAD)
    try:
        yield harness
    finally:
        harness.cleanup()


def _start_load_runs(harness: HostHarness, count: int) -> list[str]:
    client = harness.client()
    try:
        payloads = [start_payload("load", harness.project, {"n": n}) for n in range(count)]
        return [started["runId"] for started in client.start_runs(payloads)]
    finally:
        client.close()


def _trace(harness: HostHarness) -> list[str]:
    path = harness.project / "load-trace"
    return path.read_text().splitlines() if path.exists() else []


def _timed_cli(harness: HostHarness, *args: str):
    began = time.monotonic()
    result = harness.cli(*args, check=False)
    return result, time.monotonic() - began


def test_a_postgresql_restart_under_load_strands_no_run_and_runs_no_node_twice(
    harness, postgres_cluster
):
    harness.start_host()
    run_ids = _start_load_runs(harness, RUNS)
    wait_until(lambda: len(_trace(harness)) >= 4, what="runs in flight")

    postgres_cluster.stop("fast")
    try:
        status, took = _timed_cli(harness, "host", "status", "--json")
        assert took < ANSWER_WITHIN_S and status.returncode == 0, status.stderr
        answer = json.loads(status.stdout)
        assert answer["state"] == "databaseUnavailable"
        assert "database is unavailable since" in answer["databaseUnavailable"]
        text, _ = _timed_cli(harness, "host", "status")
        assert "DATABASE UNAVAILABLE" in text.stdout
        why, took = _timed_cli(harness, "run", "why", run_ids[-1])
        assert took < ANSWER_WITHIN_S and why.returncode != 0
        assert "database is unavailable since" in why.stderr, harness.host_log()
    finally:
        postgres_cluster.start()

    wait_until(lambda: harness.status()["state"] == "running", what="the host to reconnect")
    for run_id in run_ids:
        assert harness.wait_for_run(run_id, timeout=60)["status"] == "completed"
    # Workers waited for the database instead of dying: every node of every run ran once.
    starts = Counter(_trace(harness))
    assert starts == Counter(f"{n} {node}" for n in range(RUNS) for node in "abc")
    assert harness.status()["state"] == "running"
    assert "database connection restored" in harness.host_log()
    verified = json.loads(harness.cli("state", "verify", "--json").stdout)
    assert verified == {"ok": True, "problems": []}


def test_an_idle_host_serves_the_first_request_after_a_restart(harness, postgres_cluster):
    harness.start_host()
    postgres_cluster.stop("fast")
    postgres_cluster.start()

    try:
        [run_id] = _start_load_runs(harness, 1)
    except Exception as error:
        server_log = postgres_cluster.log_file.read_text()[-3000:]
        raise AssertionError(
            f"{error}\nhost log:\n{harness.host_log()[-3000:]}\nserver log:\n{server_log}"
        ) from error

    assert harness.wait_for_run(run_id)["status"] == "completed"


@pytest.mark.parametrize("how", ["host stop", "SIGTERM"])
def test_the_host_stops_while_its_database_is_down(harness, postgres_cluster, how):
    harness.start_host()
    [run_id] = _start_load_runs(harness, 1)
    wait_until(lambda: _trace(harness), what="a run in flight")
    postgres_cluster.stop("immediate")
    try:
        began = time.monotonic()
        if how == "host stop":
            result = harness.cli("host", "stop", check=False)
            assert result.returncode == 0, result.stderr + harness.host_log()
            assert "host stopped" in result.stdout
        else:
            harness.host_process.send_signal(signal.SIGTERM)
        assert harness.host_process.wait(timeout=20) == 0, harness.host_log()
        assert time.monotonic() - began < 20
    finally:
        postgres_cluster.start()

    # The next host takes over the stranded run (its claim expires) and finishes it.
    harness.start_host(PI_WORKFLOWS_RUN_LEASE_MS="2000")
    assert harness.wait_for_run(run_id, timeout=60)["status"] == "completed"
