"""A worker's write in a group commit that goes again (host/worker_gateway.py,
host/commit_group.py), on PostgreSQL, where the write checks its claim with its next
statement."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from pi_workflows.errors import ConflictError
from pi_workflows.host.active_run import ActiveRun
from pi_workflows.host.commit_group import CommitGroup
from pi_workflows.host.features import HostFeatures
from pi_workflows.host.worker_gateway import WorkerGateway
from pi_workflows.protocol.worker_messages import MESSAGE_SCHEMA, WorkerOperation
from pi_workflows.storage import record_run_change, run_claims, run_state, run_workers
from pi_workflows.storage.run_poison import ProgressMark
from pi_workflows.storage.runs import current_revision, run_record


class _RefusalWithTheSecondWrite(CommitGroup):
    """A commit group that puts a refused write of another run beside the second write
    submitted to it: that write's group fails as one block and is applied again."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.submitted = 0

    def submit(self, apply: Any, *, contained: bool = False) -> asyncio.Future[Any]:
        future = super().submit(apply, contained=contained)
        self.submitted += 1
        if self.submitted == 2:
            super().submit(_refused_write)
        return future


def _refused_write() -> None:
    record_run_change("gw-other", event_type="run.started", actor="test")
    raise ConflictError("refused")


def test_a_retried_write_whose_group_goes_again_is_applied_as_it_was_first(
    postgres_store, make_run, tmp_path
):
    """A worker's write whose held check found the run other than the host thought
    (`_RunMoved`) is applied again with the run read. When that retry's group fails as one
    block (another entry's refusal) and goes again entry by entry, the retry starts from
    the read again, not from the status its rolled-back first application left: it is
    accepted."""
    store = postgres_store
    with store.transaction():
        make_run("gw-other")
    with store.transaction():
        make_run("gw-run")
    token = run_claims.new_claim_token()
    with store.transaction():
        claim = run_claims.claim_run("gw-run", "host-1", token)
    assert claim is not None
    with store.transaction():
        run_workers.record_worker("gw-epoch", "gw-run", claim.generation, 1, "e" * 64, 2)
    with store.transaction():
        assert run_claims.mark_running("gw-run", token, claim.generation, never_ran=True)
    revision = current_revision("gw-run")
    active = ActiveRun(
        "gw-run", token, claim.generation, "gw-epoch", None, ProgressMark(0, "running")
    )
    snapshot = {
        "schema": run_state.RUN_STATE_SCHEMA,
        "runId": "gw-run",
        "status": "completed",
        "steps": [],
        "finalOutput": {"done": True},
    }
    message = {
        "schema": MESSAGE_SCHEMA,
        "messageId": "m-last",
        "kind": "final",
        "operation": WorkerOperation.WRITE_SNAPSHOT,
        "runId": "gw-run",
        "generation": claim.generation,
        "workerEpoch": "gw-epoch",
        "expectedRevision": revision,
        "payload": {"snapshot": snapshot, "trace_event": {"type": "run.completed"}},
    }

    async def write() -> tuple[dict, int]:
        group = _RefusalWithTheSecondWrite(store, lambda freed: None)
        gateway = WorkerGateway(
            active,
            SimpleNamespace(active_runs={"gw-run": active}, is_closed=False),  # type: ignore[arg-type]
            store=store,
            commits=group,
            features=HostFeatures([]),
            state_directory=tmp_path,
            envelope={},  # type: ignore[typeddict-item]  # its launch is not this test's
        )
        gateway._status = "paused"  # what the host thinks: not what the check finds
        reply = await gateway.handle(message)
        return reply, group.submitted

    reply, submitted = asyncio.run(write())

    assert submitted == 2  # the write, then its retry (beside the refused write)
    assert (reply["outcome"], reply.get("error")) == ("accepted", None)
    assert reply["revision"] == current_revision("gw-run") == revision + 1
    assert run_record("gw-run").status == "completed"
    assert current_revision("gw-other") == 1  # the refused write left nothing
