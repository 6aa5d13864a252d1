"""`pi-workflows state status|verify|backup`: inspecting, copying and compacting the state
database."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import peewee

from ..canonical import sha256_hex
from ..errors import InvalidInputError, PiWorkflowsError
from .database import SCHEMA_NAME, SCHEMA_VERSION, StateStore
from .models import Blob, Event, HumanDecision, NestedBlob, Run, RunQueue, SchemaMeta
from .prepared import tuple_rows


def state_status(store: StateStore) -> dict[str, Any]:
    """The schema and the counts; `upgradeNeeded` when the database (opened read-only)
    holds an older schema that the next host upgrades."""
    meta = SchemaMeta.get_by_id(1)
    runs_by_status = {row.status: row.count for row in _count_by(Run, Run.status)}
    queue_by_status = {row.status: row.count for row in _count_by(RunQueue, RunQueue.status)}
    return {
        "database": "sqlite" if store.is_sqlite else "postgresql",
        "location": store.location,
        "schemaName": meta.schema_name,
        "schemaVersion": meta.schema_version,
        "upgradeNeeded": meta.schema_version != SCHEMA_VERSION,
        "appVersion": meta.app_version,
        "runs": runs_by_status,
        "queue": queue_by_status,
        "pendingDecisions": HumanDecision.select().where(HumanDecision.status == "pending").count(),
        "blobs": Blob.select().count(),
        "space": _space(store),
    }


# SQLite is VACUUMed (by the host's sweep) once the file is this large and this much of it
# is free pages; smaller or fuller files are not worth rewriting.
VACUUM_MIN_BYTES = 64 * 1024 * 1024
VACUUM_MIN_FREE = 0.20


def _space(store: StateStore) -> dict[str, Any]:
    """How much room the database takes and how much of it is free (SQLite) or dead row
    versions that autovacuum has yet to reclaim (PostgreSQL)."""
    if store.is_sqlite:
        page_size = store.db.execute_sql("PRAGMA page_size").fetchone()[0]
        pages = store.db.execute_sql("PRAGMA page_count").fetchone()[0]
        free = store.db.execute_sql("PRAGMA freelist_count").fetchone()[0]
        return {"bytes": pages * page_size, "freeBytes": free * page_size}
    live, dead = store.db.execute_sql(
        "SELECT COALESCE(SUM(n_live_tup), 0), COALESCE(SUM(n_dead_tup), 0) FROM pg_stat_user_tables"
    ).fetchone()
    size = store.db.execute_sql("SELECT pg_database_size(current_database())").fetchone()[0]
    return {"bytes": int(size), "liveRows": int(live), "deadRows": int(dead)}


def vacuum_if_worthwhile(store: StateStore) -> bool:
    """VACUUM a SQLite database of at least `VACUUM_MIN_BYTES` with at least
    `VACUUM_MIN_FREE` of it free; whether it did. PostgreSQL is left to autovacuum."""
    if not store.is_sqlite:
        return False
    space = _space(store)
    if space["bytes"] < VACUUM_MIN_BYTES or space["freeBytes"] < VACUUM_MIN_FREE * space["bytes"]:
        return False
    store.db.execute_sql("VACUUM")
    return True


def upgrade_needed(version: int) -> str:
    """What to do about a database of an older schema that a read-only look left as it is."""
    return (
        f"schema: v{version} needs the upgrade to v{SCHEMA_VERSION}, which the next host does "
        "when it starts ('pi-workflows host start'); back it up first if you may go back"
    )


def _count_by(model: Any, column: Any) -> Any:
    from peewee import fn

    return model.select(column, fn.COUNT("*").alias("count")).group_by(column)


def state_verify(store: StateStore) -> list[str]:
    """Every problem found, one line each; an empty list means the state is sound.

    Reads one snapshot: a host that commits meanwhile (bumping a run's revision and
    appending its event) must not look like a run whose events do not match it.
    """
    with store.db.atomic():
        if not store.is_sqlite:  # PostgreSQL's default gives each statement its own
            store.db.execute_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return _problems(store)


def _problems(store: StateStore) -> list[str]:
    problems: list[str] = []
    if store.is_sqlite:
        integrity = [row[0] for row in store.db.execute_sql("PRAGMA integrity_check").fetchall()]
        if integrity != ["ok"]:
            problems.extend(f"integrity: {line}" for line in integrity)
        for row in store.db.execute_sql("PRAGMA foreign_key_check").fetchall():
            problems.append(f"foreign key: table {row[0]} row {row[1]} points at missing {row[2]}")
    meta = SchemaMeta.get_or_none(SchemaMeta.id == 1)
    if meta is None or meta.schema_name != SCHEMA_NAME:
        problems.append("schema_meta: missing or of another schema")
    elif meta.schema_version != SCHEMA_VERSION:
        problems.append(upgrade_needed(meta.schema_version))
    else:  # an older version may lack the table
        problems.extend(_missing_nested_blobs())
    for blob in Blob.select():
        content = bytes(blob.content)
        if sha256_hex(content) != blob.blob_hash or len(content) != blob.byte_length:
            problems.append(f"blob {blob.blob_hash[:12]}: content does not match its address")
    for run in Run.select(Run.run_id, Run.revision):
        revisions = [
            e.revision for e in Event.select(Event.revision).where(Event.run == run.run_id)
        ]
        if sorted(revisions) != list(range(1, run.revision + 1)):
            problems.append(
                f"run {run.run_id}: revision {run.revision} but {len(revisions)} events"
            )
    return problems


def _missing_nested_blobs() -> list[str]:
    """A kept value that names a blob no longer stored (pruning deleted it too soon)."""
    holder, nested = Blob.alias(), Blob.alias()
    missing = (
        NestedBlob.select(NestedBlob.holder_hash, NestedBlob.blob_hash)
        .join(holder, on=holder.blob_hash == NestedBlob.holder_hash)
        .join(nested, peewee.JOIN.LEFT_OUTER, on=nested.blob_hash == NestedBlob.blob_hash)
        .where(nested.blob_hash.is_null())
    )
    return [
        f"blob {holder_hash[:12]}: names blob {blob_hash[:12]}, which is missing"
        for holder_hash, blob_hash in tuple_rows(missing)
    ]


def state_backup(store: StateStore, destination: Path) -> dict[str, Any]:
    """Copy the SQLite database with the online backup API (safe while a host writes)."""
    if not store.is_sqlite:
        raise PiWorkflowsError(
            "state backup copies SQLite databases; back up PostgreSQL with pg_dump."
        )
    destination = destination.expanduser().resolve()
    if destination.exists():
        raise InvalidInputError(f"Backup destination {destination} exists; choose a new path.")
    if not destination.parent.is_dir():
        raise InvalidInputError(f"Directory {destination.parent} does not exist; create it first.")
    partial = destination.with_name(destination.name + ".partial")
    fd = os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.close(fd)
    try:
        target = sqlite3.connect(partial)
        try:
            store.db.connection().backup(target)
            target.execute("PRAGMA journal_mode=DELETE")
        finally:
            target.close()
        os.replace(partial, destination)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return {"destination": str(destination), "bytes": destination.stat().st_size}
