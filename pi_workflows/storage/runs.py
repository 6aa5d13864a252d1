"""Creating runs and reading them back as records and status objects."""

from __future__ import annotations

import datetime
import json
import re
import secrets
from typing import Any

from ..canonical import canonical_json
from ..clock import now_ms
from ..errors import ConflictError, NotFoundError
from ..records import RunRecord
from .blobs import put_json, put_text, read_json, read_text
from .models import Lease, Run, RunQueue
from .revisions import create_run_row


def new_run_id(workflow_name: str, at_ms: int | None = None) -> str:
    """`<YYYYMMDDTHHMMSSZ>-<slug>-<8 hex>` (SPEC §6)."""
    stamp = datetime.datetime.fromtimestamp((at_ms or now_ms()) / 1000, datetime.UTC)
    slug = re.sub(r"[^a-z0-9]+", "-", workflow_name.lower()).strip("-")[:40] or "run"
    return f"{stamp:%Y%m%dT%H%M%SZ}-{slug}-{secrets.token_hex(4)}"


def create_run(
    *,
    run_id: str,
    workflow_name: str,
    workflow_ref: str,
    workflow_source: dict[str, Any],
    definition_digest: str,
    project_path: str,
    input: Any,
    actor: str,
    execution_mode: str = "headless",
    origin_session_id: str | None = None,
    parent_run_id: str | None = None,
    root_run_id: str | None = None,
    lineage_kind: str | None = None,
    restart_number: int = 0,
    parent_terminal_fingerprint: str | None = None,
    launch_options: dict[str, Any] | None = None,
    presentation_prompt: str | None = None,
) -> Run:
    """Insert a queued run with its queue row and an unowned lease (inside a transaction)."""
    stamp = now_ms()
    run = create_run_row(
        actor=actor,
        run_id=run_id,
        workflow_name=workflow_name,
        workflow_ref=workflow_ref,
        workflow_source=canonical_json(workflow_source),
        definition_digest=definition_digest,
        project_path=project_path,
        parent_run_id=parent_run_id,
        root_run_id=root_run_id or run_id,
        lineage_kind=lineage_kind,
        restart_number=restart_number,
        parent_terminal_fingerprint=parent_terminal_fingerprint,
        launch_options_hash=put_json(launch_options or {}),
        execution_mode=execution_mode,
        origin_session_id=origin_session_id,
        status="queued",
        input_hash=put_json(input),
        presentation_prompt_hash=put_text(presentation_prompt) if presentation_prompt else None,
        created_at=stamp,
    )
    RunQueue.create(
        run=run_id,
        status="queued",
        available_at=stamp,
        origin_session_id=origin_session_id,
        created_at=stamp,
        updated_at=stamp,
    )
    Lease.create(run=run_id, generation=0)
    return run


def create_derived_run(
    parent: Run,
    *,
    run_id: str,
    lineage_kind: str,
    input: Any,
    actor: str,
    launch_options: dict[str, Any] | None = None,
    restart_number: int | None = None,
    parent_terminal_fingerprint: str | None = None,
) -> tuple[Run, bool]:
    """A continuation or restart of `parent` with a deterministic id (inside a transaction).

    A retry with the same id adopts the existing run; one that differs is a conflict.
    Returns the run and whether it was created now.
    """
    existing = Run.get_or_none(Run.run_id == run_id)
    if existing is not None:
        if (
            existing.parent_run_id != parent.run_id
            or existing.lineage_kind != lineage_kind
            or read_json(existing.input_hash) != input
        ):
            raise ConflictError(f"Workflow run preparation conflicts: {run_id}")
        return existing, False
    run = create_run(
        run_id=run_id,
        workflow_name=parent.workflow_name,
        workflow_ref=parent.workflow_ref,
        workflow_source=json.loads(parent.workflow_source),
        definition_digest=parent.definition_digest,
        project_path=parent.project_path,
        input=input,
        actor=actor,
        execution_mode=parent.execution_mode,
        origin_session_id=parent.origin_session_id,
        parent_run_id=parent.run_id,
        root_run_id=parent.root_run_id,
        lineage_kind=lineage_kind,
        restart_number=parent.restart_number if restart_number is None else restart_number,
        parent_terminal_fingerprint=parent_terminal_fingerprint,
        launch_options=launch_options,
        presentation_prompt=read_text(parent.presentation_prompt_hash),
    )
    return run, True


def get_run(run_id: str) -> Run:
    run = Run.get_or_none(Run.run_id == run_id)
    if run is None:
        raise NotFoundError(f"Workflow run {run_id} does not exist; see 'pi-workflows run list'.")
    return run


def run_record(run_id: str) -> RunRecord:
    """The run joined with its queue row, as hooks see it."""
    run = get_run(run_id)
    queue = RunQueue.get_by_id(run_id)
    return RunRecord(
        run_id=run.run_id,
        workflow_name=run.workflow_name,
        status=run.status,
        queue_status=queue.status,
        execution_mode=run.execution_mode,
        origin_session_id=run.origin_session_id,
        parent_run_id=run.parent_run_id,
        lineage_kind=run.lineage_kind,
        restart_number=run.restart_number,
        input=read_json(run.input_hash),
        launch_options=read_json(run.launch_options_hash) or {},
        available_at=queue.available_at,
        created_at=run.created_at,
        revision=run.revision,
        paused=run.paused,
        error_code=queue.error_code,
        presentation_prompt=read_text(run.presentation_prompt_hash),
    )


def run_status_json(run: Run, queue: RunQueue | None = None) -> dict[str, Any]:
    """The `run status --json` object of SPEC §13."""
    queue = queue or RunQueue.get_by_id(run.run_id)
    return {
        "runId": run.run_id,
        "workflowName": run.workflow_name,
        "status": run.status,
        "queueStatus": queue.status,
        "paused": bool(run.paused),
        "statusDetail": run.status_detail,
        "errorCode": queue.error_code,
        "finalOutput": read_json(run.final_output_hash),
        "error": read_text(run.error_hash),
        "parentRunId": run.parent_run_id,
        "restartNumber": run.restart_number,
        "revision": run.revision,
        "executionMode": run.execution_mode,
        "createdAt": run.created_at,
        "updatedAt": run.updated_at,
    }
