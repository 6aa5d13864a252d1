"""Upgrading a state database of an older schema version in place (SPEC §15).

A database of a version this module has a step for is upgraded when it is opened, in
one transaction, before anything else writes; any other version is refused with one
line by `check_schema_meta`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import peewee

from ..clock import now_ms
from ..errors import HostAlreadyRunningError
from ..event_types import EventType
from ..home import Home, home_key, machine_name
from . import statements
from .blobs import read_json, split_part_hashes
from .models import (
    JSON,
    SPLIT_PREFIX,
    Blob,
    Event,
    ForwardedCommand,
    HostState,
    NestedBlob,
    SchemaMeta,
)
from .prepared import tuple_rows

#: Split values read per query while filling in `nested_blobs`.
BACKFILL_PAGE = 200
#: The partial index of transcript events that v3 and v4 databases had (v5 drops it).
TRANSCRIPT_INDEX = "events_transcripts"
# v4: the engine's events took the one style the others had (`subject.what_happened`);
# `run_resumed` became `run.relaunched`, since `run.resumed` is the operator's resume.
RENAMED_EVENTS = {
    "run_started": EventType.RUN_STARTED,
    "run_resumed": EventType.RUN_RELAUNCHED,
    "run_completed": EventType.RUN_COMPLETED,
    "run_waiting": EventType.RUN_WAITING,
    "run_failed": EventType.RUN_FAILED,
    "run_timed_out": EventType.RUN_TIMED_OUT,
    "run_cancelled": EventType.RUN_CANCELLED,
    "node_started": EventType.NODE_STARTED,
    "node_finished": EventType.NODE_FINISHED,
    "node_failed": EventType.NODE_FAILED,
    "agent_prompt_sent": EventType.AGENT_PROMPT_SENT,
    "agent_transcript_recorded": EventType.AGENT_TRANSCRIPT_RECORDED,
    "update_published": EventType.UPDATE_PUBLISHED,
}


def _v2_to_v3(db: peewee.Database, home: Home, where: str) -> None:
    """v3: `host_state` holds one row per home, `forwarded_commands`, longer digests.

    Databases made between these changes and the version bump already have the v3
    tables; each step looks before it changes anything.
    """
    columns = {column.name for column in db.get_columns("host_state")}
    if "home_key" not in columns:
        _host_state_per_home(db, home, where)
    db.create_tables([ForwardedCommand], safe=True)
    if isinstance(db, peewee.PostgresqlDatabase):
        # "sha256:" and 64 hex digits; SQLite does not enforce VARCHAR lengths.
        db.execute_sql("ALTER TABLE human_decisions ALTER COLUMN request_digest TYPE VARCHAR(71)")


def _host_state_per_home(db: peewee.Database, home: Home, where: str) -> None:
    """Rebuild v2's single host row as the row of the home that opens the database.

    Epochs must keep growing (worker rows name their host by epoch), so the old row's
    epoch, pid and heartbeat carry over and the next host of this home takes over from
    it as from any earlier host of its own.
    """
    old = db.execute_sql(
        "SELECT epoch, host_id, token_hash, pid, process_start_identity, started_at, "
        "heartbeat_at, expires_at FROM host_state ORDER BY epoch DESC"
    ).fetchall()
    db.execute_sql("DROP TABLE host_state")
    db.create_tables([HostState])
    if not old or not old[0][0]:
        return
    epoch, host_id, token_hash, pid, identity, started_at, heartbeat_at, expires_at = old[0]
    HostState.insert(
        epoch=epoch,
        home_key=home_key(home),
        machine=machine_name(),
        host_id=host_id,
        token_hash=token_hash,
        pid=pid,
        process_start_identity=identity,
        started_at=started_at,
        heartbeat_at=heartbeat_at,
        expires_at=expires_at,
        released_at=None if host_id else heartbeat_at,
    ).execute()


def _v3_to_v4(db: peewee.Database, home: Home, where: str) -> None:
    """v4: events renamed to one style (`RENAMED_EVENTS`).

    Only the ``event_type`` column changes: an engine event's payload keeps the trace
    event it was written with, old name and all (blobs are content-addressed and shared).
    The transcript index, whose WHERE names the old type, is dropped (v5 has none: it
    has `nested_blobs` instead).
    """
    Event.update(event_type=peewee.Case(Event.event_type, list(RENAMED_EVENTS.items()))).where(
        Event.event_type.in_(list(RENAMED_EVENTS))
    ).execute()
    db.execute_sql(f"DROP INDEX IF EXISTS {TRANSCRIPT_INDEX}")


def _v4_to_v5(db: peewee.Database, home: Home, where: str) -> None:
    """v5: `nested_blobs`, filled in from the stored values that name other blobs (split
    values, transcript events' payloads). Pruning read those values themselves before;
    it no longer does, so their partial indexes go."""
    db.create_tables([NestedBlob], safe=True)
    for holder_hash, nested in _stored_nestings():
        statements.insert_nested(holder_hash, sorted(nested))
    for index in ("blobs_split_values", TRANSCRIPT_INDEX):
        db.execute_sql(f"DROP INDEX IF EXISTS {index}")


def _stored_nestings() -> Iterator[tuple[str, set[str]]]:
    """(holder, the blobs it names) of every stored value that names blobs, a page of
    split values at a time (their content may be large)."""
    is_split = peewee.fn.SUBSTR(Blob.content, 1, len(SPLIT_PREFIX)) == SPLIT_PREFIX
    after = ""
    while True:
        page = list(
            tuple_rows(
                Blob.select(Blob.blob_hash, Blob.content)
                .where((Blob.media_type == JSON) & is_split & (Blob.blob_hash > after))
                .order_by(Blob.blob_hash)
                .limit(BACKFILL_PAGE)
            )
        )
        if not page:
            break
        for blob_hash, content in page:
            yield blob_hash, split_part_hashes(bytes(content))
        after = page[-1][0]
    payloads = Event.select(Event.payload_hash).where(
        Event.event_type == EventType.AGENT_TRANSCRIPT_RECORDED
    )
    for (payload_hash,) in tuple_rows(payloads.distinct()):
        payload = read_json(payload_hash)
        if isinstance(payload, dict) and isinstance(payload.get("transcriptHash"), str):
            yield payload_hash, {payload["transcriptHash"]}


def _refuse_live_hosts(db: peewee.Database, where: str) -> None:
    """A host of the older version may still write in the old layout: it stops first.

    Reads only the columns every version's `host_state` has.
    """
    now = now_ms()
    live = db.execute_sql(
        "SELECT pid, epoch, expires_at FROM host_state "
        f"WHERE host_id IS NOT NULL AND expires_at > {db.param} ORDER BY epoch",
        (now,),
    ).fetchall()
    if live:
        pid, epoch, expires_at = live[0]
        raise HostAlreadyRunningError(
            f"{where} is in use by a host of an older pi-workflows (PID {pid}, epoch {epoch}); "
            f"stop it ('pi-workflows host stop' in its home) or wait "
            f"{(expires_at - now) // 1000 + 1} s if it crashed, then try again."
        )


UPGRADES: dict[int, Callable[[peewee.Database, Home, str], None]] = {
    2: _v2_to_v3,
    3: _v3_to_v4,
    4: _v4_to_v5,
}


def upgrade_schema(db: peewee.Database, home: Home, where: str, target: int) -> None:
    """Apply the steps from the stored version to `target` (inside a transaction).

    Re-reads the version under a lock first, so of two processes opening an old
    database at once only one upgrades it. The caller has checked that a path exists.
    """
    query = SchemaMeta.select().where(SchemaMeta.id == 1)
    if isinstance(db, peewee.PostgresqlDatabase):
        query = query.for_update()
    stored = query.first().schema_version
    if stored != target:
        _refuse_live_hosts(db, where)
    for version in range(stored, target):
        UPGRADES[version](db, home, where)
    if stored != target:
        from .. import __version__

        SchemaMeta.update(
            schema_version=target, app_version=__version__, updated_at=now_ms()
        ).where(SchemaMeta.id == 1).execute()
