"""peewee models for the state tables of SPEC §4.

Table names are contracts; columns follow reference/host-core.md §8, simplified where
the Python port does not need the original indirection (a run's revision lives on the
run row). Times are integer epoch milliseconds. Values that are large or immutable are
stored in `blobs` and referenced by their sha256 (`*_hash` columns).

Each foreign key's raw value (`run_id` beside `run`) is an attribute peewee adds at class
creation; its annotation below the field tells the type checker it is there.
"""

from __future__ import annotations

import peewee

database_proxy = peewee.DatabaseProxy()

RUN_STATUSES = ("queued", "running", "waiting", "completed", "failed", "timed_out", "cancelled")
TERMINAL_RUN_STATUSES = ("completed", "failed", "timed_out", "cancelled")
QUEUE_STATUSES = ("queued", "starting", "running", "parked", "done", "failed", "cancelled")
ACTIVE_WORKER_STATUSES = ("starting", "ready", "running")


def _check_in(column: str, values: tuple[str, ...]) -> peewee.SQL | peewee.NodeList:
    quoted = ", ".join(f"'{v}'" for v in values)
    return peewee.Check(f"{column} IN ({quoted})")


#: The media type of a JSON blob (storage.blobs).
JSON = "application/json"
#: How a stored split value's bytes begin (storage.blobs; canonical JSON sorts the parts
#: key first).
SPLIT_PREFIX = b'{"$piw-parts":'


class BaseModel(peewee.Model):
    class Meta:
        database = database_proxy
        legacy_table_names = False


class SchemaMeta(BaseModel):
    id = peewee.IntegerField(primary_key=True, constraints=[peewee.Check("id = 1")])
    schema_name = peewee.TextField()
    schema_version = peewee.IntegerField()
    app_version = peewee.TextField()
    created_at = peewee.BigIntegerField()
    updated_at = peewee.BigIntegerField()

    class Meta:
        table_name = "schema_meta"


class Blob(BaseModel):
    blob_hash = peewee.CharField(max_length=64, primary_key=True)
    media_type = peewee.TextField()
    byte_length = peewee.BigIntegerField()
    content = peewee.BlobField()
    created_at = peewee.BigIntegerField()

    class Meta:
        table_name = "blobs"


class NestedBlob(BaseModel):
    """A blob named inside another blob's content (`holder_hash`): a part of a split value,
    or the transcript an `agent_transcript_recorded` payload names. Written in the
    transaction that stores the holder, so pruning proves a blob unreferenced by lookups
    instead of reading every value that could nest it (storage.retention)."""

    blob_hash = peewee.CharField(max_length=64)
    holder_hash = peewee.CharField(max_length=64)

    class Meta:
        table_name = "nested_blobs"
        primary_key = peewee.CompositeKey("blob_hash", "holder_hash")
        # The primary key finds a blob's holders; this, what a holder nests.
        indexes = ((("holder_hash",), False),)


class HostState(BaseModel):
    """One row per home that ever ran a host on this database (SPEC §5, §14).

    A row is live while `host_id` is set and `expires_at` is in the future. Epochs grow
    across all rows and are never reused, so a worker's `host_epoch` names one host.
    """

    id = peewee.AutoField()
    epoch = peewee.IntegerField(default=0, unique=True)
    home_key = peewee.CharField(max_length=64, unique=True)  # sha256 of machine and home path
    machine = peewee.TextField()
    socket_address = peewee.TextField(null=True)
    host_id = peewee.TextField(null=True)
    token_hash = peewee.CharField(max_length=64, null=True)
    pid = peewee.IntegerField(null=True)
    process_start_identity = peewee.TextField(null=True)
    started_at = peewee.BigIntegerField(null=True)
    heartbeat_at = peewee.BigIntegerField(null=True)
    expires_at = peewee.BigIntegerField(null=True)
    released_at = peewee.BigIntegerField(null=True)  # clean stop, or takeover by another host

    class Meta:
        table_name = "host_state"


class Run(BaseModel):
    run_id = peewee.CharField(max_length=256, primary_key=True)
    workflow_name = peewee.TextField()
    workflow_ref = peewee.TextField()
    workflow_source = peewee.TextField()  # canonical JSON of the source identity
    definition_digest = peewee.CharField(max_length=64)
    project_path = peewee.TextField()
    parent_run_id = peewee.CharField(max_length=256, null=True, index=True)
    root_run_id = peewee.CharField(max_length=256)
    lineage_kind = peewee.CharField(
        null=True, constraints=[peewee.Check("lineage_kind IN ('continuation', 'restart')")]
    )
    restart_number = peewee.IntegerField(default=0)
    parent_terminal_fingerprint = peewee.CharField(max_length=64, null=True)
    launch_options_hash = peewee.CharField(max_length=64, null=True)
    execution_mode = peewee.CharField(
        constraints=[_check_in("execution_mode", ("interactive", "headless"))]
    )
    origin_session_id = peewee.CharField(max_length=256, null=True)
    status = peewee.CharField(constraints=[_check_in("status", RUN_STATUSES)])
    paused = peewee.BooleanField(default=False)
    status_detail = peewee.TextField(null=True)
    input_hash = peewee.CharField(max_length=64)
    final_output_hash = peewee.CharField(max_length=64, null=True)
    error_hash = peewee.CharField(max_length=64, null=True)
    presentation_prompt_hash = peewee.CharField(max_length=64, null=True)
    state_hash = peewee.CharField(max_length=64, null=True)  # latest run-state snapshot
    # The lifecycle status last announced through `piw_run_transition` (storage.run_transitions).
    announced_status = peewee.CharField(null=True)
    revision = peewee.IntegerField(default=1)
    created_at = peewee.BigIntegerField()
    updated_at = peewee.BigIntegerField()
    finished_at = peewee.BigIntegerField(null=True)

    class Meta:
        table_name = "runs"


class RunQueue(BaseModel):
    run = peewee.ForeignKeyField(Run, primary_key=True, on_delete="CASCADE", column_name="run_id")
    run_id: str
    status = peewee.CharField(constraints=[_check_in("status", QUEUE_STATUSES)])
    available_at = peewee.BigIntegerField()
    # Claim order: higher first, then oldest `available_at` (SPEC §3, `run start --priority`).
    priority = peewee.IntegerField(default=0)
    origin_session_id = peewee.CharField(max_length=256, null=True)
    consecutive_errors = peewee.IntegerField(default=0)
    error_code = peewee.TextField(null=True)
    error_hash = peewee.CharField(max_length=64, null=True)
    created_at = peewee.BigIntegerField()
    updated_at = peewee.BigIntegerField()
    started_at = peewee.BigIntegerField(null=True)
    finished_at = peewee.BigIntegerField(null=True)

    class Meta:
        table_name = "run_queue"


# The candidate query walks this index in claim order and stops after the window.
RunQueue.add_index(
    RunQueue.index(
        RunQueue.status, RunQueue.priority.desc(), RunQueue.available_at, RunQueue.created_at
    )
)


class Lease(BaseModel):
    """The fenced claim on a run; `generation` only grows."""

    run = peewee.ForeignKeyField(Run, primary_key=True, on_delete="CASCADE", column_name="run_id")
    run_id: str
    generation = peewee.IntegerField(default=0)
    owner_id = peewee.TextField(null=True)
    token_hash = peewee.CharField(max_length=64, null=True)
    acquired_at = peewee.BigIntegerField(null=True)
    heartbeat_at = peewee.BigIntegerField(null=True)
    expires_at = peewee.BigIntegerField(null=True, index=True)

    def is_live(self, now: int) -> bool:
        """A host holds the claim and its lease has not run out at `now`."""
        return self.owner_id is not None and self.expires_at is not None and self.expires_at > now

    class Meta:
        table_name = "leases"
        constraints = [
            peewee.SQL(
                "CHECK ((owner_id IS NULL AND token_hash IS NULL AND expires_at IS NULL) OR "
                "(owner_id IS NOT NULL AND token_hash IS NOT NULL AND expires_at IS NOT NULL))"
            )
        ]


class Event(BaseModel):
    """Immutable: exactly one per run revision."""

    event_seq = peewee.AutoField()
    run = peewee.ForeignKeyField(Run, on_delete="CASCADE", column_name="run_id", index=False)
    run_id: str
    revision = peewee.IntegerField(constraints=[peewee.Check("revision > 0")])
    event_type = peewee.TextField()
    actor = peewee.TextField()
    lease_generation = peewee.IntegerField(null=True)
    payload_hash = peewee.CharField(max_length=64)
    recorded_at = peewee.BigIntegerField()

    class Meta:
        table_name = "events"
        indexes = ((("run", "revision"), True),)


class HostCommand(BaseModel):
    """A durable client command and its receipt."""

    request_id = peewee.CharField(max_length=256, primary_key=True)
    client_id = peewee.CharField(max_length=256)
    operation = peewee.TextField()
    idempotency_key = peewee.CharField(max_length=256)
    request_fingerprint = peewee.CharField(max_length=64)
    run_id = peewee.CharField(max_length=256, null=True, index=True)
    accepted_revision = peewee.IntegerField(null=True)
    outcome = peewee.TextField()
    receipt_hash = peewee.CharField(max_length=64, null=True)
    error_hash = peewee.CharField(max_length=64, null=True)
    host_epoch = peewee.IntegerField()
    created_at = peewee.BigIntegerField()
    completed_at = peewee.BigIntegerField(null=True)

    class Meta:
        table_name = "host_commands"
        indexes = ((("client_id", "idempotency_key"), True),)


class ForwardedCommand(BaseModel):
    """A pause or cancel for a run that another host of a shared database runs (SPEC §14).

    The host that received it writes the row; the run's owner applies it on its next
    poll (or, once the run has no live owner, any host does), exactly once: the row
    leaves `pending` by compare-and-set in the transaction that applies it.
    """

    command_id = peewee.AutoField()
    run = peewee.ForeignKeyField(Run, on_delete="CASCADE", column_name="run_id")
    run_id: str
    operation = peewee.CharField(constraints=[_check_in("operation", ("run.pause", "run.cancel"))])
    client_id = peewee.CharField(max_length=256)
    status = peewee.CharField(constraints=[_check_in("status", ("pending", "applied"))])
    outcome = peewee.TextField(null=True)
    created_at = peewee.BigIntegerField()
    applied_at = peewee.BigIntegerField(null=True)

    class Meta:
        table_name = "forwarded_commands"
        indexes = ((("status", "run"), False),)


class RunWorker(BaseModel):
    worker_epoch = peewee.CharField(max_length=64, primary_key=True)
    run = peewee.ForeignKeyField(Run, on_delete="CASCADE", column_name="run_id")
    run_id: str
    generation = peewee.IntegerField(constraints=[peewee.Check("generation > 0")])
    host_epoch = peewee.IntegerField()
    launch_envelope_hash = peewee.CharField(max_length=64)
    launch_progress_revision = peewee.IntegerField()
    pid = peewee.IntegerField(null=True)
    process_start_identity = peewee.TextField(null=True)
    status = peewee.CharField(
        constraints=[
            _check_in(
                "status",
                (
                    "starting",
                    "ready",
                    "running",
                    "exited",
                    "cancelled",
                    "timedOut",
                    "crashed",
                    "claimLost",
                    "orphaned",
                ),
            )
        ]
    )
    started_at = peewee.BigIntegerField()
    ready_at = peewee.BigIntegerField(null=True)
    finished_at = peewee.BigIntegerField(null=True)
    exit_code = peewee.IntegerField(null=True)
    signal = peewee.IntegerField(null=True)
    diagnostic_hash = peewee.CharField(max_length=64, null=True)

    class Meta:
        table_name = "run_workers"


class WorkerMessage(BaseModel):
    worker = peewee.ForeignKeyField(
        RunWorker, on_delete="CASCADE", column_name="worker_epoch", index=False
    )
    worker_epoch: str
    message_id = peewee.CharField(max_length=256)
    request_fingerprint = peewee.CharField(max_length=64)
    outcome = peewee.TextField()
    accepted_revision = peewee.IntegerField(null=True)
    result_hash = peewee.CharField(max_length=64, null=True)
    error_hash = peewee.CharField(max_length=64, null=True)
    completed_at = peewee.BigIntegerField()

    class Meta:
        table_name = "worker_messages"
        primary_key = peewee.CompositeKey("worker", "message_id")


class NodeAttempt(BaseModel):
    attempt_id = peewee.CharField(max_length=256, primary_key=True)
    run = peewee.ForeignKeyField(Run, on_delete="CASCADE", column_name="run_id", index=False)
    run_id: str
    node_id = peewee.TextField()
    attempt_number = peewee.IntegerField(constraints=[peewee.Check("attempt_number > 0")])
    node_type = peewee.TextField()
    status = peewee.CharField(
        constraints=[
            _check_in(
                "status",
                (
                    "pending",
                    "running",
                    "waiting",
                    "interrupted",
                    "completed",
                    "failed",
                    "timed_out",
                    "cancelled",
                ),
            )
        ]
    )
    input_hash = peewee.CharField(max_length=64, null=True)
    output_hash = peewee.CharField(max_length=64, null=True)
    result_hash = peewee.CharField(max_length=64, null=True)
    error_hash = peewee.CharField(max_length=64, null=True)
    started_at = peewee.BigIntegerField()
    deadline_at = peewee.BigIntegerField(null=True)
    finished_at = peewee.BigIntegerField(null=True)

    class Meta:
        table_name = "node_attempts"
        indexes = ((("run", "node_id", "attempt_number"), True),)


class WorkflowUpdate(BaseModel):
    """`publish_update(type, key, data)`: the latest value per (run, type, key)."""

    id = peewee.AutoField()
    run = peewee.ForeignKeyField(Run, on_delete="CASCADE", column_name="run_id")
    run_id: str
    attempt_id = peewee.CharField(max_length=256, null=True)
    update_type = peewee.TextField()
    update_key = peewee.TextField()
    data_hash = peewee.CharField(max_length=64)
    sequence = peewee.IntegerField()
    created_at = peewee.BigIntegerField()
    updated_at = peewee.BigIntegerField()

    class Meta:
        table_name = "workflow_updates"
        indexes = ((("run", "update_type", "update_key"), True),)


class InteractiveRequest(BaseModel):
    request_id = peewee.CharField(max_length=256, primary_key=True)
    run = peewee.ForeignKeyField(Run, on_delete="CASCADE", column_name="run_id")
    run_id: str
    attempt_id = peewee.CharField(max_length=256, unique=True)
    node_id = peewee.TextField()
    target_session_id = peewee.CharField(max_length=256, null=True)
    kind = peewee.CharField(constraints=[_check_in("kind", ("agent", "assistant", "decision"))])
    contract_hash = peewee.CharField(max_length=64)
    revision = peewee.IntegerField(default=1)
    status = peewee.CharField(
        constraints=[_check_in("status", ("pending", "settled", "cancelled"))]
    )
    unproductive_turn_ends = peewee.IntegerField(default=0)
    accepted_submission_id = peewee.CharField(max_length=256, null=True)
    deadline_at = peewee.BigIntegerField(null=True)
    created_at = peewee.BigIntegerField()
    updated_at = peewee.BigIntegerField()
    settled_at = peewee.BigIntegerField(null=True)
    consumed_at = peewee.BigIntegerField(null=True)

    class Meta:
        table_name = "interactive_requests"
        indexes = ((("target_session_id", "status", "created_at"), False),)


class InteractiveSubmission(BaseModel):
    submission_id = peewee.CharField(max_length=256, primary_key=True)
    request = peewee.ForeignKeyField(
        InteractiveRequest, on_delete="CASCADE", column_name="request_id"
    )
    request_id: str
    idempotency_key = peewee.CharField(max_length=256)
    request_revision = peewee.IntegerField()
    payload_hash = peewee.CharField(max_length=64)
    outcome = peewee.CharField(
        constraints=[_check_in("outcome", ("validating", "accepted", "rejected", "adopted"))]
    )
    receipt_hash = peewee.CharField(max_length=64, null=True)
    submitted_at = peewee.BigIntegerField()

    class Meta:
        table_name = "interactive_submissions"
        indexes = ((("request", "idempotency_key"), True),)


class WorkflowMessage(BaseModel):
    workflow_message_id = peewee.CharField(max_length=256, primary_key=True)
    run = peewee.ForeignKeyField(Run, on_delete="CASCADE", column_name="run_id", index=False)
    run_id: str
    target_session_id = peewee.CharField(max_length=256)
    kind = peewee.CharField(
        constraints=[
            _check_in("kind", ("step", "decision", "notification", "terminal", "followUp"))
        ]
    )
    source_id = peewee.TextField()
    idempotency_key = peewee.TextField()
    content_hash = peewee.CharField(max_length=64)
    order_number = peewee.IntegerField(constraints=[peewee.Check("order_number > 0")])
    status = peewee.CharField(constraints=[_check_in("status", ("pending", "sent", "cancelled"))])
    session_entry_id = peewee.CharField(max_length=256, null=True)
    created_at = peewee.BigIntegerField()
    updated_at = peewee.BigIntegerField()

    class Meta:
        table_name = "workflow_messages"
        indexes = (
            (("target_session_id", "order_number"), True),
            (("target_session_id", "status", "order_number"), False),
            (("run", "order_number"), False),
        )
        constraints = [peewee.SQL("CHECK ((status = 'sent') = (session_entry_id IS NOT NULL))")]


class WorkflowTurn(BaseModel):
    workflow_turn_id = peewee.CharField(max_length=256, primary_key=True)
    workflow_message = peewee.ForeignKeyField(
        WorkflowMessage, on_delete="CASCADE", column_name="workflow_message_id"
    )
    workflow_message_id: str
    run = peewee.ForeignKeyField(Run, on_delete="CASCADE", column_name="run_id")
    run_id: str
    target_session_id = peewee.CharField(max_length=256)
    state = peewee.CharField(constraints=[_check_in("state", ("started", "ended"))])
    stop_reason = peewee.CharField(null=True)
    response_session_entry_id = peewee.CharField(max_length=256, null=True)
    started_at = peewee.BigIntegerField()
    ended_at = peewee.BigIntegerField(null=True)

    class Meta:
        table_name = "workflow_turns"
        indexes = ((("target_session_id", "state", "started_at"), False),)
        constraints = [
            peewee.SQL("CHECK ((state = 'started') = (stop_reason IS NULL AND ended_at IS NULL))")
        ]


class HumanDecision(BaseModel):
    decision_id = peewee.CharField(max_length=256, primary_key=True)
    run = peewee.ForeignKeyField(Run, on_delete="CASCADE", column_name="run_id")
    run_id: str
    attempt_id = peewee.CharField(max_length=256)
    node_id = peewee.TextField()
    audience = peewee.TextField()
    request_hash = peewee.CharField(max_length=64)
    request_digest = peewee.CharField(max_length=71)  # "sha256:" + 64 hex digits
    status = peewee.CharField(
        constraints=[_check_in("status", ("pending", "accepted", "cancelled"))]
    )
    deadline_at = peewee.BigIntegerField(null=True)
    default_response_hash = peewee.CharField(max_length=64, null=True)
    created_at = peewee.BigIntegerField()
    updated_at = peewee.BigIntegerField()

    class Meta:
        table_name = "human_decisions"
        indexes = ((("status", "deadline_at"), False),)


class HumanDecisionResolution(BaseModel):
    """The one winner of a decision: the primary key enforces it."""

    decision = peewee.ForeignKeyField(
        HumanDecision, primary_key=True, on_delete="CASCADE", column_name="decision_id"
    )
    decision_id: str
    provenance = peewee.CharField(
        constraints=[_check_in("provenance", ("human", "timeout", "cancellation"))]
    )
    channel = peewee.TextField(null=True)
    actor = peewee.TextField(null=True)
    response_hash = peewee.CharField(max_length=64, null=True)
    continuation_run_id = peewee.CharField(max_length=256, null=True)
    resolved_at = peewee.BigIntegerField()

    class Meta:
        table_name = "human_decision_resolutions"


class Effect(BaseModel):
    effect_id = peewee.CharField(max_length=256, primary_key=True)
    run = peewee.ForeignKeyField(Run, on_delete="CASCADE", column_name="run_id", null=True)
    run_id: str | None
    scope = peewee.CharField(constraints=[_check_in("scope", ("run", "channel", "system"))])
    effect_type = peewee.TextField()
    idempotency_key = peewee.TextField()
    policy = peewee.CharField(constraints=[_check_in("policy", ("idempotent", "manual"))])
    payload_hash = peewee.CharField(max_length=64, null=True)
    status = peewee.CharField(
        constraints=[
            _check_in(
                "status", ("pending", "applying", "applied", "rejected", "ambiguous", "cancelled")
            )
        ]
    )
    attempt_count = peewee.IntegerField(default=0)
    next_attempt_at = peewee.BigIntegerField(null=True)
    result_hash = peewee.CharField(max_length=64, null=True)
    error_hash = peewee.CharField(max_length=64, null=True)
    created_at = peewee.BigIntegerField()
    updated_at = peewee.BigIntegerField()
    settled_at = peewee.BigIntegerField(null=True)

    class Meta:
        table_name = "effects"
        indexes = ((("run", "effect_type", "idempotency_key"), True),)


class RunProcess(BaseModel):
    """A process group a worker started for its run (SPEC §7.4a), registered before it
    runs any user command so the host can kill it when the run stops on this machine."""

    id = peewee.AutoField()  # peewee's implicit key, named so the type checker sees it
    run = peewee.ForeignKeyField(Run, on_delete="CASCADE", column_name="run_id")
    run_id: str
    worker = peewee.ForeignKeyField(RunWorker, on_delete="CASCADE", column_name="worker_epoch")
    worker_epoch: str
    process_group = peewee.IntegerField()
    start_identity = peewee.TextField()
    machine = peewee.TextField()
    kind = peewee.TextField()  # shell | agent
    status = peewee.CharField(constraints=[_check_in("status", ("running", "ended", "killed"))])
    registered_at = peewee.BigIntegerField()
    ended_at = peewee.BigIntegerField(null=True)

    class Meta:
        table_name = "run_processes"
        indexes = ((("worker", "process_group", "start_identity"), True), (("status",), False))


# Partial unique indexes: the invariants of SPEC §4 that the database itself enforces.
RunWorker.add_index(
    RunWorker.index(RunWorker.run, unique=True, name="run_workers_one_active").where(
        RunWorker.status.in_(ACTIVE_WORKER_STATUSES)
    )
)
NodeAttempt.add_index(
    NodeAttempt.index(NodeAttempt.run, unique=True, name="node_attempts_one_active").where(
        NodeAttempt.status.in_(("pending", "running", "waiting"))
    )
)
WorkflowMessage.add_index(
    WorkflowMessage.index(
        WorkflowMessage.source_id, unique=True, name="workflow_messages_one_pending_step"
    ).where((WorkflowMessage.kind == "step") & (WorkflowMessage.status == "pending"))
)
WorkflowTurn.add_index(
    WorkflowTurn.index(
        WorkflowTurn.workflow_message, unique=True, name="workflow_turns_one_open"
    ).where(WorkflowTurn.state == "started")
)
Run.add_index(
    Run.index(Run.parent_run_id, unique=True, name="runs_one_restart_child").where(
        Run.lineage_kind == "restart"
    )
)

ALL_MODELS = (
    SchemaMeta,
    Blob,
    NestedBlob,
    HostState,
    Run,
    RunQueue,
    Lease,
    Event,
    HostCommand,
    ForwardedCommand,
    RunWorker,
    WorkerMessage,
    NodeAttempt,
    WorkflowUpdate,
    InteractiveRequest,
    InteractiveSubmission,
    WorkflowMessage,
    WorkflowTurn,
    HumanDecision,
    HumanDecisionResolution,
    Effect,
    RunProcess,
)


def blob_columns(model: type[peewee.Model]) -> list[peewee.Field]:
    """The columns of `model` that hold a blob's address: `*_hash` (not `token_hash`, a
    secret's) and a run's `definition_digest` (its definition snapshot's, run_graph.py)."""
    if model in (Blob, NestedBlob):  # addresses of blobs, not rows that reference them
        return []
    return [
        f
        for f in model._meta.sorted_fields
        if (f.name.endswith("_hash") and f.name != "token_hash") or f is Run.definition_digest
    ]


def _blob_column_indexes() -> list[tuple[type[BaseModel], peewee.ModelIndex]]:
    """An index on every blob column of a table other than `blobs`, so that pruning proves
    a blob unreferenced by lookups instead of reading whole tables. A column that may be
    NULL (most rows leave an error's empty) is indexed only where it is set."""
    indexes: list[tuple[type[BaseModel], peewee.ModelIndex]] = []
    for model in ALL_MODELS:
        for column in blob_columns(model):
            index = model.index(column, name=f"{model._meta.table_name}_{column.column_name}")
            indexes.append((model, index.where(column.is_null(False)) if column.null else index))
    return indexes


# Indexes added after schema v3 was released: a database of that version gets those it
# lacks when it is opened for writing (`database.reconcile_indexes`), no upgrade step.
ADDED_INDEXES: tuple[tuple[type[BaseModel], peewee.ModelIndex], ...] = (
    # Pruning finds a lineage by its root and deletes each run's rows by run id.
    (Run, Run.index(Run.root_run_id, name="runs_root_run_id")),
    (RunWorker, RunWorker.index(RunWorker.run, name="run_workers_run_id")),
    (
        InteractiveRequest,
        InteractiveRequest.index(InteractiveRequest.run, name="interactive_requests_run_id"),
    ),
    (HumanDecision, HumanDecision.index(HumanDecision.run, name="human_decisions_run_id")),
    (WorkflowTurn, WorkflowTurn.index(WorkflowTurn.run, name="workflow_turns_run_id")),
    (RunProcess, RunProcess.index(RunProcess.run, name="run_processes_run_id")),
    (
        ForwardedCommand,
        ForwardedCommand.index(ForwardedCommand.run, name="forwarded_commands_run_id"),
    ),
    # `run list` (and `--status`, `--workflow`) pages newest first.
    (Run, Run.index(Run.created_at, Run.run_id, name="runs_created_run_id")),
    (Run, Run.index(Run.status, Run.created_at, Run.run_id, name="runs_status_created")),
    (
        Run,
        Run.index(Run.workflow_name, Run.created_at, Run.run_id, name="runs_workflow_created"),
    ),
)


ADDED_INDEXES += (
    *_blob_column_indexes(),
    # Old blobs nothing references are found by age, not by reading the whole table.
    (Blob, Blob.index(Blob.created_at, Blob.blob_hash, name="blobs_created_at")),
)
for _model, _index in ADDED_INDEXES:
    _model.add_index(_index)

# Indexes a database made before they went is rid of when it is opened for writing
# (`database.reconcile_indexes`). Each cost every write of its table and served no
# lookup another index does not: `runs (status, updated_at)` (a status is looked up
# with `runs_status_created`); `runs (created_at)`, and a foreign key's own index where
# another index of its table begins with that column (`index=False` above): events,
# node attempts, workflow messages by run, worker messages by worker. A run's every bump
# moves `updated_at`, so the first was written at each; on PostgreSQL an update that
# changes an indexed column writes an entry in each of the table's indexes.
DROPPED_INDEXES = (
    "runs_status_updated_at",
    "runs_created_at",
    "events_run_id",
    "node_attempts_run_id",
    "workflow_messages_run_id",
    "worker_messages_worker_epoch",
)
