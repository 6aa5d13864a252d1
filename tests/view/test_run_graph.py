"""`run.graph`: the definition snapshot a run was started with and its steps, from a real
host (what the viewer draws), and a start whose snapshot is not the digest's refused."""

from __future__ import annotations

import pytest

from pi_workflows.client.connection import RequestFailed
from pi_workflows.client.start_request import start_payload
from pi_workflows.discovery import find
from pi_workflows.testing.host import WorkflowHost

from .test_real_run import use_scripted_agent


def _branch_snapshot(host: WorkflowHost) -> dict:
    found = find("branch", host.project)
    assert found.definition is not None, found.error
    return found.definition.snapshot()


@pytest.mark.integration
def test_run_graph_answers_the_started_definition_and_the_steps(workflow_host) -> None:
    use_scripted_agent(workflow_host, {"classify": {"route": "checkpoint", "reason": "which?"}})
    workflow_host.start()
    run_id = workflow_host.start_run("branch", {"task": "Tidy up the README."})
    workflow_host.wait_for_status(run_id, "waiting")
    client = workflow_host.client()
    try:
        graph = client.run_graph(run_id)
    finally:
        client.close()

    assert graph["definition"] == _branch_snapshot(workflow_host)
    assert graph["run"]["status"] == "waiting" and graph["run"]["runId"] == run_id
    assert [(s["nodeId"], s["outcome"]) for s in graph["steps"]] == [
        ("classify", "ok"),
        ("checkpoint_lane", "ok"),
    ]
    assert graph["steps"][0]["output"] == {"route": "checkpoint", "reason": "which?"}
    assert "prompt" in graph["steps"][0]  # the agent's input, for the step pane


@pytest.mark.integration
def test_run_start_refuses_a_snapshot_that_is_not_the_digests(workflow_host) -> None:
    workflow_host.start()
    payload = start_payload("branch", workflow_host.project)
    payload["definitionSnapshot"] = {**payload["definitionSnapshot"], "startAt": "elsewhere"}
    client = workflow_host.client()
    try:
        with pytest.raises(RequestFailed) as refused:
            client.start_run(payload)
        runs = client.list_runs()
        # Without a snapshot (an older client's start) the run starts, with no graph.
        del payload["definitionSnapshot"]
        run_id = client.start_run(payload)["runId"]
        graph = client.run_graph(run_id)
    finally:
        client.close()

    assert refused.value.response.outcome == "rejected"
    assert "definitionSnapshot is not the definition definitionDigest names" in str(refused.value)
    assert runs == []  # nothing half-written
    assert workflow_host.query(
        "SELECT count(*) FROM blobs WHERE blob_hash = ?", payload["definitionDigest"]
    ) == [(0,)]
    assert graph["definition"] is None and graph["runId"] == run_id
