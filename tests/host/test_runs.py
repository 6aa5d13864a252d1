"""Runs through a real host and real workers: start, crash recovery, no-progress parking."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from pi_workflows.client import HostConnection
from pi_workflows.client.start_request import start_payload

from .conftest import HostHarness, wait_until
from .workflows import BLOCKER, CRASHY, STEPS


@pytest.mark.integration
@pytest.mark.scenario("4.18")
def test_run_start_hello_wait_starts_the_host_and_prints_the_greeting(harness: HostHarness):
    result = harness.cli("run", "start", "hello", "--input-json", '{"name": "Ada"}', "--wait")
    assert "Hello, Ada!" in result.stdout
    assert harness.home.lock_path.exists()  # the host was started on demand
    status = harness.cli("host", "status", "--json")
    assert json.loads(status.stdout)["state"] == "running"
    harness.cli("host", "stop")
    assert json.loads(harness.cli("host", "status", "--json").stdout)["state"] == "stopped"


def test_run_start_json_prints_the_status_object(harness: HostHarness):
    harness.start_host()
    result = harness.cli("run", "start", "hello", "--wait", "--json", "--no-autostart")
    status = json.loads(result.stdout)
    assert status["status"] == "completed"
    assert status["queueStatus"] == "done"
    assert status["finalOutput"] == {"greeting": "Hello, world!"}
    for key in (
        "runId",
        "workflowName",
        "paused",
        "statusDetail",
        "errorCode",
        "error",
        "parentRunId",
        "restartNumber",
        "revision",
    ):
        assert key in status
    listed = json.loads(harness.cli("run", "list", "--json").stdout)
    assert [run["runId"] for run in listed] == [status["runId"]]


@pytest.mark.scenario("3.1")
def test_shell_workflow_completes_in_a_worker(harness: HostHarness):
    harness.start_host()
    result = harness.cli("run", "start", "shell", "--wait", "--json", "--no-autostart")
    status = json.loads(result.stdout)
    assert status["status"] == "completed", status
    assert status["finalOutput"] is not None


@pytest.mark.integration
def test_no_autostart_refuses_without_a_host(harness: HostHarness):
    result = harness.cli("run", "start", "hello", "--no-autostart", check=False)
    assert result.returncode == 1
    assert "No workflow host is running" in result.stderr
    assert not harness.home.lock_path.exists()


@pytest.mark.scenario("2.1", "2.21", "3.1", "9.6")
def test_worker_sigkill_mid_node_resumes_with_a_higher_generation(harness: HostHarness):
    harness.write_workflow("steps", STEPS)
    harness.start_host()
    run_id = harness.start_run("steps")
    first_pid = harness.wait_for_pid("b.pid")
    assert os.getpgid(first_pid) == first_pid  # every worker leads its own process group
    os.kill(first_pid, signal.SIGKILL)

    # The new worker reruns the interrupted node b; completed node a is not run again.
    harness.wait_for_pid("b.pid", previous=first_pid)
    (harness.project / "release-b").touch()
    status = harness.wait_for_status(run_id, "completed")
    assert status["finalOutput"] == {"sum": 3}
    trace = (harness.project / "trace").read_text().split()
    assert trace == ["a", "b", "b", "c"]
    workers = wait_until(
        lambda: (w := harness.workers(run_id)) and [x[1] for x in w] == ["crashed", "exited"] and w,
        what="the worker records",
    )
    assert workers[0][0] < workers[1][0]


@pytest.mark.scenario("3.6", "3.7", "A.2")
def test_worker_dying_before_progress_is_parked_and_not_relaunched(harness: HostHarness):
    harness.write_workflow("crashy", CRASHY)
    (harness.project / "crash-on-load").touch()
    harness.start_host()
    run_id = harness.start_run("crashy")
    wait_until(
        lambda: harness.client().run_status(run_id)["errorCode"] == "workerNoProgress",
        what="the no-progress park",
    )
    status = harness.client().run_status(run_id)
    assert status["queueStatus"] == "parked"
    assert "before it committed workflow progress" in status["statusDetail"]
    # A newer run is claimed and finishes; had the parked run been claimable, the
    # oldest-first claim pass would have taken it first.
    other = harness.start_run("hello")
    harness.wait_for_status(other, "completed")
    assert len(harness.workers(run_id)) == 1

    (harness.project / "crash-on-load").unlink()
    harness.cli("run", "resume", run_id)
    status = harness.wait_for_status(run_id, "completed")
    assert status["finalOutput"] == {"survived": True}
    assert status["errorCode"] is None


def test_run_start_batch_starts_every_run_in_one_request_or_none(harness: HostHarness):
    harness.start_host()
    client = harness.client()
    try:
        payload = start_payload("hello", harness.project, {"name": "Ada"})
        started = client.start_runs([payload] * 3)
        assert len({run["runId"] for run in started}) == 3
        for run in started:
            status = harness.wait_for_status(run["runId"], "completed")
            assert status["finalOutput"] == {"greeting": "Hello, Ada!"}

        broken = {**payload, "projectPath": "relative/path"}
        refused = client.send("run.startBatch", {"runs": [payload, broken]})
        assert refused.outcome == "rejected"
        assert refused.error.startswith("runs[1]: projectPath must be absolute")
        # All or none: the valid first run of the refused batch was not created either.
        assert len(client.list_runs()) == 3
    finally:
        client.close()


@pytest.mark.scenario("11.11")
def test_a_started_run_stores_its_definition_and_source_and_a_bad_source_stores_nothing(
    harness: HostHarness,
):
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host()
    payload = start_payload("blocker", harness.project, None)
    assert payload["workflowSource"]["kind"] == "file"
    with HostConnection(harness.home.socket_path) as connection:
        started = connection.request("run.start", payload)
        mounted = {**payload, "workflowSource": {"kind": "mounted", "root": "x"}}
        refused = connection.request("run.start", mounted)
    run_id = started.receipt["runId"]
    ((source, digest, project),) = harness.query(
        "SELECT workflow_source, definition_digest, project_path FROM runs WHERE run_id = ?",
        run_id,
    )
    assert json.loads(source) == payload["workflowSource"]
    assert (digest, project) == (payload["definitionDigest"], str(harness.project))
    assert harness.query("SELECT run_id FROM run_queue") == [(run_id,)]

    assert refused.outcome == "rejected"
    assert refused.error == "workflowSource must be a file, builtin or plugin source"
    assert harness.query("SELECT run_id FROM runs") == [(run_id,)]
    (harness.project / "release").touch()
    harness.wait_for_status(run_id, "completed")


# A short lease, still six of the test kit's 0.5 s heartbeats long: its workers stop at the
# fence time, 3/4 of a lease after a renewal starts, and on a loaded 2-core machine the
# heartbeats of a host on PostgreSQL were seen up to 0.85 s apart (a 1.5 s lease left
# 0.3 s to spare; a 0.9 s one lost the worker in 2 runs of 3).
SHORT_LEASE_MS = 3000


@pytest.mark.scenario("2.23")
def test_the_host_renews_a_run_claim_while_its_node_blocks_past_the_lease(harness: HostHarness):
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host(PI_WORKFLOWS_RUN_LEASE_MS=str(SHORT_LEASE_MS))
    run_id = harness.start_run("blocker")
    harness.wait_for_pid("blocker.pid")

    def lease() -> tuple[int, int]:
        rows = harness.query("SELECT generation, expires_at FROM leases WHERE run_id = ?", run_id)
        return rows[0]

    generation, first_expiry = lease()
    # The node outlives two whole leases; the host's heartbeat keeps renewing the claim.
    wait_until(
        lambda: lease()[1] > first_expiry + 2 * SHORT_LEASE_MS,
        what="the claim to be renewed past two leases",
    )
    generation_now, expires_at = lease()
    assert generation_now == generation == 1
    assert expires_at > time.time() * 1000
    assert harness.client().run_status(run_id)["status"] == "running"
    (harness.project / "release").touch()
    harness.wait_for_status(run_id, "completed")
    assert [w[0] for w in harness.workers(run_id)] == [1]  # one worker, never replaced


def test_run_list_pages_with_before_and_filters_by_workflow_and_status(harness: HostHarness):
    harness.start_host()
    ids = [harness.start_run("hello", {"name": f"n{index}"}) for index in range(3)]
    for run_id in ids:
        harness.wait_for_run(run_id)

    first = harness.cli("run", "list", "--limit", "2").stdout.splitlines()
    newest_two = [line.split()[0] for line in first[:2]]
    assert first[2] == f"more: pi-workflows run list --before {newest_two[-1]}"
    rest = harness.cli("run", "list", "--limit", "2", "--before", newest_two[-1], "--json")
    older = [run["runId"] for run in json.loads(rest.stdout)]
    assert sorted(newest_two + older) == sorted(ids) and len(older) == 1
    assert harness.cli("run", "list", "--workflow", "other").stdout.strip() == "no runs"
    completed = json.loads(harness.cli("run", "list", "--status", "completed", "--json").stdout)
    assert len(completed) == 3
    bad = harness.cli("run", "list", "--status", "done", check=False)
    assert bad.returncode != 0 and "status must be one of" in bad.stderr
