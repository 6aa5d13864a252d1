"""Run revisions: every change bumps the revision by one and appends one event."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ..clock import now_ms
from ..errors import NotFoundError, RevisionConflictError
from ..event_types import EventType
from ..records import RunRecord
from . import run_transitions, statements
from .blobs import put_json, put_json_in_parts
from .models import Run


class _Bumped(threading.local):
    """The revision of each run whose row this thread's open transaction holds (None: no
    transaction): one it created, bumped (an UPDATE locks the row until the transaction
    ends) or locked as it read it (`note_held`). The transaction can then name a run's
    revision without reading it back, and its next bump of that run needs no answer
    from the database: nobody else can change the row before it commits.

    `StateStore` keeps it: empty when a transaction begins, emptied when a savepoint rolls
    back (what it undid, with the locks it took, is not tracked: the next reads and
    bumps go to the database), None again when the transaction ends.
    """

    def __init__(self) -> None:
        self.revisions: dict[str, int] | None = None
        # Runs this transaction created, as created, and the revision until which no
        # other change touched them (`created_unchanged`).
        self.created: dict[str, tuple[int, NewRun]] = {}
        # Their rows as `runs.RECORD_COLUMNS` would read them (`created_row`).
        self.created_rows: dict[str, tuple[Any, ...]] = {}
        # Runs this transaction claimed, as the claim's read found them: their launch
        # fields, progress (finished attempts, status) and record as the claim left it,
        # and the revision until which no other change touched them (`claimed_unchanged`).
        self.claimed: dict[str, tuple[int, NewRun, tuple[int, str], RunRecord]] = {}


@dataclass(frozen=True)
class NewRun:
    """What a transaction that created a run knows of it without reading: the fields a
    claim launches its worker with, as stored (they never change)."""

    project_path: str
    workflow_source: str
    definition_digest: str
    input_hash: str


_bumped = _Bumped()


def transaction_began() -> None:
    _bumped.revisions = {}
    _bumped.created, _bumped.created_rows, _bumped.claimed = {}, {}, {}


def rolled_back() -> None:
    if _bumped.revisions is not None:
        _bumped.revisions.clear()
        _bumped.created.clear()
        _bumped.created_rows.clear()
        _bumped.claimed.clear()


def transaction_ended() -> None:
    _bumped.revisions = None
    _bumped.created, _bumped.created_rows, _bumped.claimed = {}, {}, {}


def created_unchanged(run_id: str) -> NewRun | None:
    """The run, if this transaction created it and changed it since only as the steps
    that say so (`note_unchanged`) did: still queued, never claimed but by this
    transaction, with no worker, attempt or interaction of its own."""
    entry = _bumped.created.get(run_id)
    if entry is None or entry[0] != written_revision(run_id):
        return None
    return entry[1]


def note_created_row(run_id: str, row: tuple[Any, ...]) -> None:
    """A run this transaction just created, as a read of its record would find it."""
    if _bumped.revisions is not None:
        _bumped.created_rows[run_id] = row


def created_row(run_id: str) -> tuple[Any, ...] | None:
    """`note_created_row`'s row of a run this transaction created (it may have changed)."""
    return _bumped.created_rows.get(run_id)


def note_unchanged(run_id: str, run: NewRun) -> None:
    """The change the transaction just made to a run it created (its claim) leaves what
    `created_unchanged` says true."""
    revision = written_revision(run_id)
    if revision is not None:
        _bumped.created[run_id] = (revision, run)


def note_claimed(run_id: str, run: NewRun, progress: tuple[int, str], record: RunRecord) -> None:
    """The claim this transaction just took of a run it read (`run_claims.claim_run`):
    what the read found of the run's launch fields and progress, and its record as the
    claim left it, stand until another change of the run."""
    revision = written_revision(run_id)
    if revision is not None:
        _bumped.claimed[run_id] = (revision, run, progress, record)


def claimed_unchanged(run_id: str) -> tuple[NewRun, tuple[int, str], int, RunRecord] | None:
    """The launch fields, progress (finished attempts, status), revision and record of a
    run this transaction claimed and changed no further since (`note_claimed`)."""
    entry = _bumped.claimed.get(run_id)
    if entry is None or entry[0] != written_revision(run_id):
        return None
    revision, run, progress, record = entry
    return run, progress, revision, record


def written_revision(run_id: str) -> int | None:
    """The revision this transaction's last write of the run gave it (None: not written)."""
    revisions = _bumped.revisions
    return None if revisions is None else revisions.get(run_id)


def _note(run_id: str, revision: int) -> None:
    if _bumped.revisions is not None:
        _bumped.revisions[run_id] = revision


def note_held(run_id: str, revision: int) -> None:
    """The open transaction read the run at `revision` and holds its row (a read ``FOR
    UPDATE``, or SQLite's write lock): its bumps of the run need not read back."""
    _note(run_id, revision)


def _committed_before(run_id: str) -> bool:
    """Whether the run's row was there before this transaction's held statements: not
    created by it (since its last savepoint's rollback, which sent or dropped what was
    held before). Its events may then join other runs' (`statements.insert_event`)."""
    return run_id not in _bumped.created


def create_run_row(*, actor: str, **fields: Any) -> Run:
    """Insert a run at revision 1 with its creation event (call inside a transaction)."""
    stamp = fields.pop("created_at", None) or now_ms()
    values = {"revision": 1, "created_at": stamp, "updated_at": stamp, **fields}
    # Nothing reads these rows back before the transaction's next statement: they go with it.
    statements.insert_row(Run, values, later=True)
    run = Run(**values)
    _note(run.run_id, 1)
    if _bumped.revisions is not None:
        new = NewRun(run.project_path, run.workflow_source, run.definition_digest, run.input_hash)
        _bumped.created[run.run_id] = (1, new)
    payload_hash = put_json({"status": run.status})
    statements.insert_event(
        run.run_id, 1, EventType.RUN_CREATED, actor, None, payload_hash, stamp, shared=False
    )
    run_transitions.note(run.run_id, EventType.RUN_CREATED)
    return run


def record_run_change(
    run_id: str,
    *,
    event_type: EventType,
    actor: str,
    payload: Any = None,
    payload_hash: str | None = None,
    expected_revision: int | None = None,
    lease_generation: int | None = None,
    **updates: Any,
) -> int:
    """Apply `updates` to the run, bump its revision by one, append one event.

    Call inside a transaction. The event's payload is `payload`, or the blob `payload_hash`
    the caller stored. With `expected_revision`, a run at another revision raises
    :class:`RevisionConflictError` and nothing changes. Returns the new revision.
    """
    stamp = now_ms()
    held = written_revision(run_id)
    if held is None and not statements.bumps_with_event():  # SQLite, a run not held yet
        found = statements.bump_revision(run_id, stamp, updates, expected_revision)
        revision = _reached(run_id, found, expected_revision)
        statements.insert_event(
            run_id,
            revision,
            event_type,
            actor,
            lease_generation,
            payload_hash or put_json_in_parts(payload if payload is not None else {}),
            stamp,
            shared=_committed_before(run_id),
        )
    else:
        # The event's payload is stored first (a refused bump leaves an unreferenced
        # blob, which the caller's rollback or the next prune removes).
        event_hash = payload_hash or put_json_in_parts(payload if payload is not None else {})
        event = (event_type, actor, lease_generation, event_hash)
        if held is not None:
            # The transaction holds the run's row: the bump reaches the next revision,
            # and nothing needs to come back from the database.
            _check_expected(run_id, held, expected_revision)
            revision = held + 1
            statements.bump_revision_later(
                run_id, revision, stamp, updates, event, shared=_committed_before(run_id)
            )
        else:  # one round trip: the bump and its event
            found = statements.bump_revision_with_event(
                run_id, stamp, updates, expected_revision, event
            )
            revision = _reached(run_id, found, expected_revision)
    _note(run_id, revision)
    run_transitions.note(run_id, event_type)
    return revision


def _check_expected(run_id: str, revision: int, expected_revision: int | None) -> None:
    if expected_revision is not None and expected_revision != revision:
        raise RevisionConflictError(
            f"Workflow run {run_id} is at revision {revision}, not "
            f"{expected_revision}; read it again and retry."
        )


def _reached(run_id: str, revision: int | None, expected_revision: int | None) -> int:
    """The revision a bump returned; when it matched no row, why."""
    if revision is not None:
        return revision
    current = Run.get_or_none(Run.run_id == run_id)
    if current is None:
        raise NotFoundError(f"Workflow run {run_id} does not exist.")
    _check_expected(run_id, current.revision, expected_revision)
    raise RevisionConflictError(f"Workflow run {run_id} changed while it was written.")
