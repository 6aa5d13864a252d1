"""Creating runs and reading them back as records and status objects."""

from __future__ import annotations

import datetime
import functools
import json
import re
import secrets
from typing import Any, TypeVar

import peewee

from ..canonical import canonical_json
from ..clock import now_ms
from ..errors import ConflictError, NotFoundError
from ..event_types import EventType
from ..records import RunRecord, stored_run_record
from . import server_plans, statements
from .blobs import put_json_stored, put_text, read_json, read_text
from .driver import run_sql
from .models import Blob, Event, Lease, Run, RunQueue, database_proxy
from .prepared import PreparedQuery, model_instance
from .revisions import create_run_row, note_created_row, written_revision
from .terminal_facts import note_run_kind


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
    priority: int = 0,
) -> Run:
    """Insert a queued run with its queue row and an unowned lease (inside a transaction)."""
    stamp = now_ms()
    input_hash, input_content = put_json_stored(input)
    options_hash, options_content = put_json_stored(launch_options or {})
    prompt_content = presentation_prompt.encode("utf-8") if presentation_prompt else None
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
        launch_options_hash=options_hash,
        execution_mode=execution_mode,
        origin_session_id=origin_session_id,
        status="queued",
        input_hash=input_hash,
        presentation_prompt_hash=put_text(presentation_prompt) if presentation_prompt else None,
        created_at=stamp,
    )
    note_run_kind(run_id, execution_mode, origin_session_id)
    statements.insert_row(
        RunQueue,
        {
            "run": run_id,
            "status": "queued",
            "available_at": stamp,
            "priority": priority,
            "origin_session_id": origin_session_id,
            "created_at": stamp,
            "updated_at": stamp,
        },
        later=True,
    )
    statements.insert_row(Lease, {"run": run_id, "generation": 0}, later=True)
    # As `RECORD_COLUMNS` would read it: a claim of this transaction launches without a read.
    fields = {
        "run_id": run_id,
        "workflow_name": workflow_name,
        "status": "queued",
        "queue_status": "queued",
        "execution_mode": execution_mode,
        "origin_session_id": origin_session_id,
        "parent_run_id": parent_run_id,
        "lineage_kind": lineage_kind,
        "restart_number": restart_number,
        "available_at": stamp,
        "created_at": stamp,
        "revision": 1,
        "paused": False,
        "error_code": None,
        "priority": priority,
    }
    blobs = (input_content, options_content, prompt_content)
    note_created_row(run_id, (*(fields[name] for name in _RECORD_FIELDS), *blobs))
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
    if not statements.hold_run(parent.run_id):  # a prune deleted its lineage meanwhile
        raise NotFoundError(f"Workflow run not found: {parent.run_id}")
    row = _RUN.first(run_id=run_id)
    if row is not None:
        existing = model_instance(Run, row)
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
        priority=_QUEUE_PRIORITY.scalar(run_id=parent.run_id),
    )
    return run, True


_RUN = PreparedQuery(lambda p: Run.select().where(Run.run_id == p.run_id), planned=True)
_QUEUE_PRIORITY = PreparedQuery(
    lambda p: RunQueue.select(RunQueue.priority).where(RunQueue.run == p.run_id),
    planned=True,
)
_RUN_REVISION = PreparedQuery(
    lambda p: Run.select(Run.revision).where(Run.run_id == p.run_id), planned=True
)
_RUN_STATUS = PreparedQuery(
    lambda p: Run.select(Run.status).where(Run.run_id == p.run_id), planned=True
)
_RUN_ORIGIN_SESSION = PreparedQuery(
    lambda p: Run.select(Run.origin_session_id).where(Run.run_id == p.run_id),
    planned=True,
)


def get_run(run_id: str) -> Run:
    row = _RUN.first(run_id=run_id)
    if row is None:
        raise NotFoundError(f"Workflow run {run_id} does not exist; see 'pi-workflows run list'.")
    return model_instance(Run, row)


@functools.cache
def _fields_query(names: tuple[str, ...]) -> PreparedQuery:
    return PreparedQuery(
        lambda p: Run.select(*(getattr(Run, name) for name in names)).where(Run.run_id == p.run_id),
        planned=True,
    )


def run_fields(run_id: str, *names: str) -> tuple[Any, ...]:
    """Only these fields of the run, as stored (a hot path's `get_run`, without building
    the whole model)."""
    row = _fields_query(names).first(run_id=run_id)
    if row is None:
        raise NotFoundError(f"Workflow run {run_id} does not exist; see 'pi-workflows run list'.")
    return row


def current_revision(run_id: str) -> int | None:
    """The run's revision (None: no such run). After a write of the run in the open
    transaction, the revision that write returned: no round trip to read it back."""
    written = written_revision(run_id)
    if written is not None:
        return written
    revision: int | None = _RUN_REVISION.scalar(run_id=run_id)
    return revision


def current_status(run_id: str) -> str | None:
    """The run's status (None: no such run)."""
    status: str | None = _RUN_STATUS.scalar(run_id=run_id)
    return status


def paused_since(run_id: str) -> int | None:
    """When the run was last paused (its latest `run.paused` event), if ever."""
    paused_at: int | None = (
        Event.select(peewee.fn.MAX(Event.recorded_at))
        .where((Event.run == run_id) & (Event.event_type == EventType.RUN_PAUSED))
        .scalar()
    )
    return paused_at


def refuse_answer_while_paused(run_id: str) -> None:
    """Answers to a paused run's checkpoint or decision wait for `run resume`
    (reference: a paused run → `conflict` "Workflow run is paused")."""
    if Run.select(Run.paused).where(Run.run_id == run_id).scalar():
        raise ConflictError(
            f"Workflow run is paused; resume it ('pi-workflows run resume {run_id}') before "
            "answering it."
        )


def origin_session_id(run_id: str) -> str | None:
    """The session that started the run (None: started outside a session)."""
    session_id: str | None = _RUN_ORIGIN_SESSION.scalar(run_id=run_id)
    return session_id


# One round trip per question: the host asks these on every claim pass and status call,
# so the run, its queue row and the blobs it needs come back in a single query.
_RUN_AND_QUEUE = """
    FROM runs r
    JOIN run_queue q ON q.run_id = r.run_id
"""
_STATUS_COLUMNS = f"""
    r.run_id, r.workflow_name, r.status, q.status, r.paused, r.status_detail, q.error_code,
    output_blob.content, error_blob.content, r.parent_run_id, r.restart_number, r.revision,
    q.priority, r.execution_mode, r.created_at, r.updated_at
    {_RUN_AND_QUEUE}
    LEFT JOIN blobs output_blob ON output_blob.blob_hash = r.final_output_hash
    LEFT JOIN blobs error_blob ON error_blob.blob_hash = r.error_hash
"""
# `RunRecord` fields in the order `_RECORD_COLUMNS` selects them, before the blobs.
_RECORD_FIELDS = (
    "run_id",
    "workflow_name",
    "status",
    "queue_status",
    "execution_mode",
    "origin_session_id",
    "parent_run_id",
    "lineage_kind",
    "restart_number",
    "available_at",
    "created_at",
    "revision",
    "paused",
    "error_code",
    "priority",
)
# The fields read from the queue row (field -> its column); the others are the run's.
_QUEUE_FIELDS = {"queue_status": "status", "available_at": "available_at"}
_QUEUE_FIELDS |= {"error_code": "error_code", "priority": "priority"}
_FIELD_COLUMNS = ", ".join(
    f"q.{_QUEUE_FIELDS[name]}" if name in _QUEUE_FIELDS else f"r.{name}" for name in _RECORD_FIELDS
)
_RECORD_COLUMNS = f"""
    {_FIELD_COLUMNS}, input_blob.content, options_blob.content, prompt_blob.content
    {_RUN_AND_QUEUE}
    LEFT JOIN blobs input_blob ON input_blob.blob_hash = r.input_hash
    LEFT JOIN blobs options_blob ON options_blob.blob_hash = r.launch_options_hash
    LEFT JOIN blobs prompt_blob ON prompt_blob.blob_hash = r.presentation_prompt_hash
"""


def _run_rows(
    columns: str, where: str, params: list[Any], suffix: str = "", *, by_key: bool = False
) -> list[tuple[Any, ...]]:
    """`by_key`: the runs are named by their ids (the server may plan it once)."""
    database = database_proxy.obj
    sql = _runs_select(columns, where, suffix)
    run = server_plans.run if by_key else run_sql
    fetched: list[tuple[Any, ...]] = run(database, sql, params).fetchall()
    return fetched


def _runs_select(columns: str, where: str, suffix: str = "") -> str:
    return f"SELECT {columns} WHERE {where} {suffix}".replace("?", database_proxy.obj.param)


def _json(content: Any) -> Any:
    return None if content is None else json.loads(bytes(content))


def _options(content: Any) -> dict[str, Any]:
    return _json(content) or {}


def _text(content: Any) -> str | None:
    return None if content is None else bytes(content).decode("utf-8")


_FIELD_COUNT = len(_RECORD_FIELDS)


# `_RECORD_COLUMNS` for a peewee query of runs joined with their queue rows: the record's
# fields, then its three blobs (`join_record_blobs`); `record_from_row` builds it.
_RECORD_BLOBS = tuple(Blob.alias(f"record_{name}_blob") for name in ("input", "options", "prompt"))
RECORD_COLUMNS: tuple[Any, ...] = (
    *(
        getattr(RunQueue, _QUEUE_FIELDS[name]) if name in _QUEUE_FIELDS else getattr(Run, name)
        for name in _RECORD_FIELDS
    ),
    *(blob.content for blob in _RECORD_BLOBS),
)


_Select = TypeVar("_Select", bound="peewee.ModelSelect[Any]")


def join_record_blobs(query: _Select) -> _Select:
    """The blob joins `RECORD_COLUMNS` reads (left outer, of the query's `Run`)."""
    input_blob, options_blob, prompt_blob = _RECORD_BLOBS
    outer = peewee.JOIN.LEFT_OUTER
    return (
        query.join(input_blob, outer, on=(input_blob.blob_hash == Run.input_hash))
        .switch(Run)
        .join(options_blob, outer, on=(options_blob.blob_hash == Run.launch_options_hash))
        .switch(Run)
        .join(prompt_blob, outer, on=(prompt_blob.blob_hash == Run.presentation_prompt_hash))
    )


def record_from_row(row: tuple[Any, ...], **changes: Any) -> RunRecord:
    """The record of `RECORD_COLUMNS`' (or `_RECORD_COLUMNS`') values, with `changes` to
    its fields (what the reading transaction wrote since)."""
    # A claim pass builds one per candidate it asks about (thousands behind a veto):
    # one dict, handed over whole. `zip` stops at the last field; the blobs follow.
    fields = dict(zip(_RECORD_FIELDS, row, strict=False))
    fields.update(changes)
    fields["paused"] = bool(fields["paused"])
    note_run_kind(fields["run_id"], fields["execution_mode"], fields["origin_session_id"])
    input_content, options_content, prompt_content = row[_FIELD_COUNT:]
    fields["presentation_prompt"] = _text(prompt_content)
    # Decoded when a hook reads them: most candidates of a claim pass are never looked at.
    encoded = {"input": (_json, input_content), "launch_options": (_options, options_content)}
    return stored_run_record(encoded, fields)


def run_records(run_ids: list[str]) -> list[RunRecord]:
    """Records of `run_ids` (missing runs are left out), in the order given."""
    if not run_ids:
        return []
    marks = ", ".join("?" for _ in run_ids)
    rows = _run_rows(_RECORD_COLUMNS, f"r.run_id IN ({marks})", run_ids, by_key=True)
    by_id = {row[0]: record_from_row(row) for row in rows}
    return [by_id[run_id] for run_id in run_ids if run_id in by_id]


def running_run_records(workflow_name: str | None, owner_id: str | None) -> list[RunRecord]:
    """Runs with a worker starting or running, the longest running first; only those of
    `workflow_name` and those whose claim `owner_id` holds, when given."""
    where, params = ["q.status IN ('starting', 'running')"], []
    if workflow_name is not None:
        where.append("r.workflow_name = ?")
        params.append(workflow_name)
    if owner_id is not None:
        where.append("EXISTS (SELECT 1 FROM leases l WHERE l.run_id = r.run_id AND l.owner_id = ?)")
        params.append(owner_id)
    rows = _run_rows(_RECORD_COLUMNS, " AND ".join(where), params, "ORDER BY q.started_at")
    return [record_from_row(row) for row in rows]


def queued_run_count(workflow_name: str | None) -> int:
    """Runs waiting for a worker (queued, not paused), of `workflow_name` when given."""
    where = "q.status = 'queued' AND r.paused = ?"
    params: list[Any] = [False]
    if workflow_name is not None:
        where += " AND r.workflow_name = ?"
        params.append(workflow_name)
    return int(_run_rows("COUNT(*)" + _RUN_AND_QUEUE, where, params)[0][0])


def run_record(run_id: str) -> RunRecord:
    """The run joined with its queue row, as hooks see it."""
    records = run_records([run_id])
    if not records:
        raise NotFoundError(f"Workflow run {run_id} does not exist; see 'pi-workflows run list'.")
    return records[0]


_STATUS_KEYS = (
    "runId",
    "workflowName",
    "status",
    "queueStatus",
    "paused",
    "statusDetail",
    "errorCode",
    "finalOutput",
    "error",
    "parentRunId",
    "restartNumber",
    "revision",
    "priority",
    "executionMode",
    "createdAt",
    "updatedAt",
)


def _status(row: tuple[Any, ...]) -> dict[str, Any]:
    status = dict(zip(_STATUS_KEYS, row, strict=True))
    status["paused"] = bool(status["paused"])
    status["finalOutput"] = _json(status["finalOutput"])
    status["error"] = _text(status["error"])
    return status


def run_status(run_id: str) -> dict[str, Any]:
    """The `run status --json` object of SPEC §13."""
    rows = _run_rows(_STATUS_COLUMNS, "r.run_id = ?", [run_id], by_key=True)
    if not rows:
        raise NotFoundError(f"Workflow run {run_id} does not exist; see 'pi-workflows run list'.")
    return _with_continuation(_status(rows[0]))


def statuses_read(run_ids: set[str]) -> tuple[str, list[Any]]:
    """The statement that reads the `run_status` of each of `run_ids` (``%s``
    placeholders), for a read that travels with a commit (`StateStore.read_with_commit`);
    `statuses_from` makes its rows into status objects."""
    ordered = sorted(run_ids)
    sql = _runs_select(_STATUS_COLUMNS, f"r.run_id IN ({', '.join(['?'] * len(ordered))})")
    return server_plans.to_send(database_proxy.obj, sql), ordered


def statuses_from(rows: list[tuple[Any, ...]]) -> dict[str, dict[str, Any]]:
    """The status objects of `statuses_read`'s rows, by run id."""
    return {row[0]: _with_continuation(_status(row)) for row in rows}


def run_statuses(
    limit: int,
    *,
    before: str | None = None,
    status: str | None = None,
    workflow: str | None = None,
) -> list[dict[str, Any]]:
    """Status objects of the newest runs, newest first; only those of `status` or of
    `workflow` when given, and with `before` (a run id) the page that follows that run.

    Each page is one range read of an index on (status or workflow,) created_at, run_id,
    however many runs the database holds.
    """
    where, params = ["1 = 1"], []
    if status is not None:
        where.append("r.status = ?")
        params.append(status)
    if workflow is not None:
        where.append("r.workflow_name = ?")
        params.append(workflow)
    if before is not None:
        created_at = _RUN_CREATED.scalar(run_id=before)
        if created_at is None:
            raise NotFoundError(f"Workflow run {before} does not exist; page from another run.")
        where.append("(r.created_at < ? OR (r.created_at = ? AND r.run_id < ?))")
        params += [created_at, created_at, before]
    rows = _run_rows(
        _STATUS_COLUMNS,
        " AND ".join(where),
        [*params, limit],
        "ORDER BY r.created_at DESC, r.run_id DESC LIMIT ?",
    )
    return [_with_continuation(_status(row)) for row in rows]


_RUN_CREATED = PreparedQuery(
    lambda p: Run.select(Run.created_at).where(Run.run_id == p.run_id), planned=True
)


# One link per answered checkpoint or decision; the walk is bounded all the same.
MAX_CONTINUATION_LINKS = 1000
_CONTINUATION = PreparedQuery(
    lambda p: (
        Run.select(Run.run_id, Run.status)
        .where((Run.parent_run_id == p.run_id) & (Run.lineage_kind == "continuation"))
        .order_by(Run.created_at.desc())
        .limit(1)
    )
)


def continuation(run_id: str) -> dict[str, Any] | None:
    """The run that carries an answered run on: its `runId`, and the `status` of the chain's
    newest run (`latestRunId`: the continuation may have been answered and continued too)."""
    child = _CONTINUATION.first(run_id=run_id)
    if child is None:
        return None
    latest = child
    for _ in range(MAX_CONTINUATION_LINKS):
        following = _CONTINUATION.first(run_id=latest[0])
        if following is None:
            break
        latest = following
    return {"runId": child[0], "latestRunId": latest[0], "status": latest[1]}


def _with_continuation(status: dict[str, Any]) -> dict[str, Any]:
    """`status` with `continuation` (see above) for an answered run — it stays `waiting`
    with its queue row `done` — so a parent never looks stuck; None for any other run."""
    answered = status["status"] == "waiting" and status["queueStatus"] == "done"
    status["continuation"] = continuation(status["runId"]) if answered else None
    return status
