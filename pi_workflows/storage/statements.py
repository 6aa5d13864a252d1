"""Hand-written SQL for the statements every durable boundary runs.

peewee stays the schema and model layer and builds every other query; for these few,
building the query object and its SQL text each time cost more than the write itself
(more than half of the host's time under load). They are written once here in SQLite
and PostgreSQL alike (``INSERT … ON CONFLICT``, ``RETURNING``), with ``?`` placeholders
turned into the open database's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import peewee

from ..event_types import EventType
from . import server_plans
from .deferred_statements import DeferredStatements, HeldCheck
from .driver import run_sql
from .models import Run, database_proxy


def execute(sql: str, params: Sequence[Any] = ()) -> Any:
    """Run one statement on the open state database; returns its cursor. Each of these is
    a key lookup or a write by key, so on PostgreSQL the server may plan it once per
    connection (`server_plans`)."""
    db = database_proxy.obj
    return server_plans.run(db, _in_style(db.param, sql), params)


def execute_later(sql: str, params: Sequence[Any] = ()) -> None:
    """Run a write whose outcome nothing reads: on PostgreSQL, inside a transaction, it
    travels with the transaction's next statement (see `deferred_statements`), and a
    failure surfaces there, in the same savepoint."""
    db = database_proxy.obj
    run_later(db, _in_style(db.param, sql), params)


def run_later(
    db: peewee.Database,
    sql: str,
    params: Sequence[Any],
    *,
    planned: bool = True,
    key: Hashable = None,
    written: Any = None,
) -> None:
    """`run_sql` for a write whose cursor nobody reads (see `execute_later`). Held, a
    `planned` one (a write by key) travels as ``EXECUTE`` once the server planned it
    (`server_plans`); one with a `key` replaces the waiting write of that key
    (`DeferredStatements.hold_write`)."""
    if not _hold(db, sql, params, planned=planned, key=key, written=written):
        run_sql(db, sql, params)


def _hold(
    db: peewee.Database,
    sql: str,
    params: Sequence[Any],
    *,
    planned: bool,
    check: HeldCheck | None = None,
    key: Hashable = None,
    written: Any = None,
    across_checks: bool = False,
) -> bool:
    """Hold `sql` for the transaction's next statement, a write or, with `check`, a
    check (`DeferredStatements.hold_check`); False where it cannot be held (SQLite, or
    outside a transaction)."""
    deferred = DeferredStatements.on(db)
    if deferred is None or not db.in_transaction():
        return False
    sent = server_plans.to_send(db, sql) if planned else sql
    if check is not None:
        return deferred.hold_check(sent, params, check)
    return deferred.hold_write(sent, params, key=key, written=written, across_checks=across_checks)


def _waiting_write(db: peewee.Database, key: Hashable, *, across_checks: bool = False) -> Any:
    """What the write held with `key` that a write of that key would replace wrote
    (`DeferredStatements.waiting_write`); None where nothing is held (SQLite)."""
    deferred = DeferredStatements.on(db)
    return None if deferred is None else deferred.waiting_write(key, across_checks=across_checks)


def _insert_later(
    key: Hashable,
    new_rows: list[tuple[Any, ...]],
    sql_for: Callable[[int], str],
    *,
    or_now: bool = True,
) -> bool:
    """Hold the insert of `new_rows` (``?`` placeholders: `sql_for(count)` inserts that
    many rows); it joins the held insert of `key` before it while only writes and
    checks were held after that one, as one statement of all their rows, in that
    insert's place. No held check reads the tables these inserts write (blobs, events,
    worker replies: the checks read the host's lease, a run's claim and revision, a
    client's stored commands), so the rows may go before one. Where it cannot be held
    (SQLite, or outside a transaction) the rows are inserted at once, unless not
    `or_now`; returns whether they were held."""
    db = database_proxy.obj
    waiting = _waiting_write(db, key, across_checks=True)
    all_rows = new_rows if waiting is None else [*waiting, *new_rows]
    params = [value for row in all_rows for value in row]
    sql = _in_style(db.param, sql_for(len(all_rows)))
    if _hold(db, sql, params, planned=True, key=key, written=all_rows, across_checks=True):
        return True
    if or_now:
        execute(sql, params)
    return False


def hold_check(sql: str, params: Sequence[Any], check: HeldCheck) -> bool:
    """A check by key (``?`` placeholders) that travels with the transaction's next
    statement and makes it raise `check.failure()` when it fails (`HeldCheck`); False
    where it cannot travel: the caller checks at once."""
    db = database_proxy.obj
    return _hold(db, _in_style(db.param, sql), params, planned=True, check=check)


def rows(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    fetched: list[tuple[Any, ...]] = execute(sql, params).fetchall()
    return fetched


@functools.lru_cache(maxsize=256)
def _in_style(placeholder: str, sql: str) -> str:
    return sql if placeholder == "?" else sql.replace("?", placeholder)


def _marks(count: int) -> str:
    """``?, ?, …``: `count` placeholders."""
    return ", ".join(["?"] * count)


# --- blobs -----------------------------------------------------------------------------

INSERT_BLOB = (
    "INSERT INTO blobs (blob_hash, media_type, byte_length, content, created_at) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (blob_hash) DO NOTHING"
)
SELECT_BLOB = "SELECT media_type, byte_length, content FROM blobs WHERE blob_hash = ?"


def insert_blob(blob_hash: str, media_type: str, content: bytes, stamp: int) -> bool:
    """True when the row is new; False when a row with this hash already existed."""
    cursor = execute(INSERT_BLOB, (blob_hash, media_type, len(content), content, stamp))
    return bool(cursor.rowcount == 1)


@functools.lru_cache(maxsize=16)
def _insert_blobs_sql(count: int, returning: bool = True) -> str:
    values = ", ".join(["(?, ?, ?, ?, ?)"] * count)
    sql = (
        "INSERT INTO blobs (blob_hash, media_type, byte_length, content, created_at) "
        f"VALUES {values} ON CONFLICT (blob_hash) DO NOTHING"
    )
    return sql + " RETURNING blob_hash" if returning else sql


def _blob_rows(blobs: list[tuple[str, str, bytes]], stamp: int) -> list[tuple[Any, ...]]:
    return [
        (blob_hash, media_type, len(content), content, stamp)
        for blob_hash, media_type, content in blobs
    ]


def insert_blobs(blobs: list[tuple[str, str, bytes]], stamp: int) -> set[str]:
    """Insert (hash, media type, content) rows of distinct hashes in one statement;
    returns the hashes that are new (the others were stored already)."""
    params = [value for row in _blob_rows(blobs, stamp) for value in row]
    return {row[0] for row in rows(_insert_blobs_sql(len(blobs)), params)}


def insert_blobs_later(blobs: list[tuple[str, str, bytes]], stamp: int) -> bool:
    """`insert_blobs`, held for the transaction's next statement (PostgreSQL, inside a
    transaction): nobody learns which rows were new, so the caller checks them with the
    blobs it took up (`blobs.check_taken_up`). False where it cannot be held.

    The rows join the held insert of blobs before them (`_insert_later`: a worker's
    write stores its node's output and its new state, then the next node's; a group,
    each of its writes'), as one statement, in that insert's place. A blob row
    references no other row, so inserting it earlier keeps every reference to it after
    it; and no transaction holds one address twice (`blobs` skips an address it
    wrote)."""
    sql_for = functools.partial(_insert_blobs_sql, returning=False)
    return _insert_later(("blobs",), _blob_rows(blobs, stamp), sql_for, or_now=False)


@functools.lru_cache(maxsize=8)
def _insert_nested_sql(count: int) -> str:
    values = ", ".join(["(?, ?)"] * count)
    return (
        f"INSERT INTO nested_blobs (blob_hash, holder_hash) VALUES {values} ON CONFLICT DO NOTHING"
    )


def insert_nested(holder_hash: str, nested: Sequence[str]) -> None:
    """Record that the blob `holder_hash` names each of `nested` in its content."""
    params: list[Any] = []
    for blob_hash in nested:
        params += [blob_hash, holder_hash]
    execute_later(_insert_nested_sql(len(nested)), params)


# A blob row locked against deletion until the transaction ends (PostgreSQL's weakest row
# lock: it lets other writers share it and only a delete or key change wait).
SELECT_BLOB_TO_REUSE = SELECT_BLOB + " FOR KEY SHARE"


def select_blob(blob_hash: str, *, reuse: bool = False) -> tuple[str, int, bytes] | None:
    """The stored (media type, length, content) of a blob, or None.

    With `reuse`, the row is held until the transaction ends, so a prune running alongside
    cannot delete the blob this transaction is about to reference (on SQLite the
    transaction's write lock shuts every other writer out already).
    """
    locking = reuse and database_proxy.obj.for_update
    found = rows(SELECT_BLOB_TO_REUSE if locking else SELECT_BLOB, (blob_hash,))
    if not found:
        return None
    media_type, byte_length, content = found[0]
    return media_type, byte_length, bytes(content)


#: Addresses one `select_blobs` statement asks for at most.
BLOBS_PER_SELECT = 100


@functools.lru_cache(maxsize=8)
def _select_blobs_sql(count: int, locking: bool) -> str:
    sql = (
        "SELECT blob_hash, media_type, byte_length, content FROM blobs "
        f"WHERE blob_hash IN ({_marks(count)})"
    )
    return sql + " FOR KEY SHARE" if locking else sql


def select_blobs(
    blob_hashes: Sequence[str], *, reuse: bool = False
) -> dict[str, tuple[str, int, bytes]]:
    """`select_blob` of each address, in one statement per `BLOBS_PER_SELECT`; an
    address with no row is left out."""
    locking = reuse and database_proxy.obj.for_update
    found: dict[str, tuple[str, int, bytes]] = {}
    for start in range(0, len(blob_hashes), BLOBS_PER_SELECT):
        chunk = blob_hashes[start : start + BLOBS_PER_SELECT]
        for blob_hash, media_type, byte_length, content in rows(
            _select_blobs_sql(len(chunk), locking), chunk
        ):
            found[blob_hash] = (media_type, byte_length, bytes(content))
    return found


# --- runs --------------------------------------------------------------------------------

HOLD_RUN = "SELECT 1 FROM runs WHERE run_id = ?"


def hold_run(run_id: str) -> bool:
    """Whether the run exists, its row held until the transaction ends (PostgreSQL's
    `FOR KEY SHARE`), so a prune cannot delete it while this transaction derives a run from
    it; on SQLite the transaction's write lock shuts every other writer out already."""
    locking = " FOR KEY SHARE" if database_proxy.obj.for_update else ""
    return bool(rows(HOLD_RUN + locking, (run_id,)))


# --- run revisions ---------------------------------------------------------------------

INSERT_EVENT = (
    "INSERT INTO events (run_id, revision, event_type, actor, lease_generation, "
    "payload_hash, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


@functools.lru_cache(maxsize=16)
def _insert_events_sql(count: int) -> str:
    return INSERT_EVENT + ", (?, ?, ?, ?, ?, ?, ?)" * (count - 1)


Converters = tuple[Callable[[Any], Any], ...]


def _assignments(names: tuple[str, ...]) -> tuple[str, Converters]:
    """``, column = ?`` for each of these model fields, and each one's conversion."""
    fields = [Run._meta.fields[name] for name in names]
    text = "".join(f", {field.column_name} = ?" for field in fields)
    return text, tuple(field.db_value for field in fields)


@functools.lru_cache(maxsize=64)
def _bump(names: tuple[str, ...], checked: bool) -> tuple[str, Converters]:
    """The bump's SQL for these model fields, and each field's conversion to its column."""
    assignments, converters = _assignments(names)
    check = " AND revision = ?" if checked else ""
    sql = (
        f"UPDATE runs SET revision = revision + 1, updated_at = ?{assignments} "
        f"WHERE run_id = ?{check} RETURNING revision"
    )
    return sql, converters


def bump_revision(
    run_id: str, stamp: int, updates: dict[str, Any], expected_revision: int | None
) -> int | None:
    """Apply `updates` (model field names) and bump the revision; None when no row matched."""
    sql, converters = _bump(tuple(updates), expected_revision is not None)
    found = rows(sql, _bump_params(run_id, stamp, updates, converters, expected_revision))
    return found[0][0] if found else None


def _bump_params(
    run_id: str,
    stamp: int,
    updates: dict[str, Any],
    converters: Converters,
    expected_revision: int | None,
) -> list[Any]:
    # Callers pass plain values here, never expressions such as `Run.revision + 1`.
    params = [stamp, *map(_converted, converters, updates.values()), run_id]
    if expected_revision is not None:
        params.append(expected_revision)
    return params


def bumps_with_event() -> bool:
    """Whether the open database takes the bump and its event in one statement (a
    data-modifying WITH, which PostgreSQL has and SQLite has not)."""
    return isinstance(database_proxy.obj, peewee.PostgresqlDatabase)


def bump_revision_with_event(
    run_id: str,
    stamp: int,
    updates: dict[str, Any],
    expected_revision: int | None,
    event: tuple[str, str, int | None, str],
) -> int | None:
    """`bump_revision` and `insert_event` of the revision it reached, in one round trip:
    ``event`` is (type, actor, lease generation, payload hash). None when no row matched
    (and no event was inserted). Only where `bumps_with_event`."""
    sql, converters = _bump(tuple(updates), expected_revision is not None)
    params = _bump_params(run_id, stamp, updates, converters, expected_revision)
    found = rows(
        f"WITH bumped AS ({sql}) INSERT INTO events (run_id, revision, event_type, actor, "
        "lease_generation, payload_hash, recorded_at) "
        "SELECT ?, revision, ?, ?, ?, ?, ? FROM bumped RETURNING revision",
        [*params, run_id, *event, stamp],
    )
    return found[0][0] if found else None


@functools.lru_cache(maxsize=64)
def _set_revision(names: tuple[str, ...]) -> tuple[str, Converters]:
    assignments, converters = _assignments(names)
    return f"UPDATE runs SET revision = ?, updated_at = ?{assignments} WHERE run_id = ?", converters


def bump_revision_later(
    run_id: str,
    revision: int,
    stamp: int,
    updates: dict[str, Any],
    event: tuple[str, str, int | None, str],
    *,
    shared: bool,
) -> None:
    """`bump_revision_with_event` to `revision`, which the caller knows the bump reaches
    (its transaction holds the run's row, `revisions.note_held`): held writes, nothing
    read back. Were the run at another revision after all, the event's (run, revision)
    would be taken and the transaction would fail rather than record a wrong history.

    The run's previous bump, when it still waits with only writes after it (a worker's
    write bumps its run twice: the node's end, the new state), becomes this one: one
    ``UPDATE`` to this revision with both bumps' columns, the later values winning, in
    the first one's place. The row ends as the two would leave it, and on PostgreSQL the
    runs table's many indexes are written once instead of twice (an update that changes
    an indexed column, as `updated_at` is, writes an entry in every index). Nothing held
    between them writes a run's row: a new run's insert comes before its bumps, the
    announced statuses after the commit's read."""
    db = database_proxy.obj
    key = ("runs", run_id)
    waiting = _waiting_write(db, key)
    if waiting is not None:  # both set the revision outright: the later one's stands
        updates = {**waiting, **updates}
    sql, converters = _set_revision(tuple(updates))
    params = [revision, stamp, *map(_converted, converters, updates.values()), run_id]
    run_later(db, _in_style(db.param, sql), params, key=key, written=updates)
    _insert_event_later((run_id, revision, *event, stamp), shared=shared)


def _converted(converter: Callable[[Any], Any], value: Any) -> Any:
    return converter(value)


def insert_event(
    run_id: str,
    revision: int,
    event_type: EventType,
    actor: str,
    lease_generation: int | None,
    payload_hash: str,
    stamp: int,
    *,
    shared: bool,
) -> None:
    """Append an event (whose revision the caller knows): a write nothing reads back.
    `shared`: the run's row was committed before this transaction, so its events may
    join other runs' (`_insert_event_later`)."""
    _insert_event_later(
        (run_id, revision, event_type, actor, lease_generation, payload_hash, stamp),
        shared=shared,
    )


def _insert_event_later(row: tuple[Any, ...], *, shared: bool) -> None:
    """Insert the event `row` (its run first): held, it joins the held insert of events
    before it (`_insert_later`: a worker's write appends two, its worker's ready
    bookkeeping one before its claim check, and a group's writes theirs), as one
    statement of several rows, in that insert's place. A run created by this
    transaction (not `shared`) has its events joined only with its own: its row is
    inserted after that place, and an event must follow its run's row."""
    _insert_later(("events",) if shared else ("events", row[0]), [row], _insert_events_sql)


# --- node attempts ---------------------------------------------------------------------

SELECT_ATTEMPTS = (
    "SELECT attempt_id, node_id, attempt_number, status, node_type, started_at "
    "FROM node_attempts WHERE run_id = ?"
)


def run_attempts(run_id: str) -> list[tuple[str, str, int, str, str, int]]:
    """``(attempt_id, node_id, attempt_number, status, node_type, started_at)`` of every
    attempt of the run."""
    return rows(SELECT_ATTEMPTS, (run_id,))


# --- worker messages -------------------------------------------------------------------

SELECT_WORKER_MESSAGE = (
    "SELECT request_fingerprint, outcome, accepted_revision, result_hash, error_hash "
    "FROM worker_messages WHERE worker_epoch = ? AND message_id = ?"
)


def insert_worker_message(
    worker_epoch: str,
    message_id: str,
    fingerprint: str,
    outcome: str,
    revision: int | None,
    result_hash: str | None,
    error_hash: str | None,
    stamp: int,
) -> None:
    """Store a worker message's reply: held, it joins the held insert of the replies
    before it (`_insert_later`: the writes of a group's workers, applied as one block,
    each after its claim check: `host.commit_group`), as one statement of several rows,
    in that insert's place. A reply's worker was recorded before it wrote, by an
    earlier commit, so the row's reference holds wherever it goes."""
    row = (worker_epoch, message_id, fingerprint, outcome, revision, result_hash, error_hash, stamp)
    _insert_later(("worker_messages",), [row], _insert_worker_messages_sql)


@functools.lru_cache(maxsize=16)
def _insert_worker_messages_sql(count: int) -> str:
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * count)
    return (
        "INSERT INTO worker_messages (worker_epoch, message_id, request_fingerprint, outcome, "
        "accepted_revision, result_hash, error_hash, completed_at) "
        f"VALUES {values} ON CONFLICT (worker_epoch, message_id) DO NOTHING"
    )


def worker_message(worker_epoch: str, message_id: str) -> tuple[Any, ...] | None:
    """``(fingerprint, outcome, revision, result_hash, error_hash)`` of a stored message."""
    found = rows(SELECT_WORKER_MESSAGE, (worker_epoch, message_id))
    return found[0] if found else None


# --- lifecycle announcements -----------------------------------------------------------


# A lifecycle row: (run_id, status, paused, status_detail, announced_status, queue_status,
# workflow_name). An attempt row has the same columns: (attempt_id, status, NULL, NULL,
# NULL, NULL, workflow_name) and its attempt number where a run row has NULL. A blob row
# (blob_hash, media_type, NULL x 5, byte_length) alone has content, in the last column.
_LIFECYCLE_ROWS = (
    "SELECT r.run_id, r.status, r.paused, r.status_detail, r.announced_status, q.status, "
    "r.workflow_name, NULL, NULL FROM runs r JOIN run_queue q ON q.run_id = r.run_id "
    "WHERE r.run_id IN ({})"
)
_ATTEMPT_ROWS = (
    "SELECT a.attempt_id, a.status, NULL, NULL, NULL, NULL, r.workflow_name, a.attempt_number, "
    "NULL FROM node_attempts a JOIN runs r ON r.run_id = a.run_id WHERE a.attempt_id IN ({})"
)
_TAKEN_UP_ROWS = (
    "SELECT blob_hash, media_type, NULL, NULL, NULL, NULL, NULL, byte_length, content FROM taken_up"
)


@functools.lru_cache(maxsize=64)
def _commit_rows_sql(run_count: int, attempt_count: int, blob_count: int, locking: bool) -> str:
    selects = []
    if run_count:
        selects.append(_LIFECYCLE_ROWS.format(_marks(run_count)))
    if attempt_count:
        selects.append(_ATTEMPT_ROWS.format(_marks(attempt_count)))
    if not blob_count:
        return " UNION ALL ".join(selects)
    # The blobs' read holds their rows (`select_blobs`); a locking read must be a query of
    # its own, so it is a common table expression, evaluated once whatever reads it. Its
    # rows come first: a NULL column takes its type from the first branch that has one,
    # and only they have content (bytea).
    materialized = "MATERIALIZED " if locking else ""
    taken_up = f"WITH taken_up AS {materialized}({_select_blobs_sql(blob_count, locking)}) "
    return taken_up + " UNION ALL ".join([_TAKEN_UP_ROWS, *selects])


class CommitRows(NamedTuple):
    """What the end of a transaction reads in one statement (`commit_rows`)."""

    runs: list[tuple[Any, ...]]
    attempts: list[tuple[Any, ...]]
    blobs: dict[str, tuple[str, int, bytes]]


def commit_rows(run_ids: list[str], attempt_ids: list[str], blob_hashes: list[str]) -> CommitRows:
    """What a commit announces and the blobs it took up, in one read: ``(run_id, status,
    paused, status_detail, announced_status, queue_status, workflow_name)`` per run,
    ``(attempt_id, status, attempt_number, workflow_name)`` per node attempt, and the
    blobs as `select_blobs` with `reuse` reads (and holds) them. More blobs than one
    statement reads take a read of their own."""
    found = CommitRows([], [], {})
    if len(blob_hashes) > BLOBS_PER_SELECT:
        found.blobs.update(select_blobs(blob_hashes, reuse=True))
        blob_hashes = []
    if not (run_ids or attempt_ids or blob_hashes):
        return found
    locking = database_proxy.obj.for_update
    sql = _commit_rows_sql(len(run_ids), len(attempt_ids), len(blob_hashes), locking)
    # The taken-up rows' parameters come first: their query leads the statement.
    for row in rows(sql, [*blob_hashes, *run_ids, *attempt_ids]):
        if row[8] is not None:
            found.blobs[row[0]] = (row[1], row[7], bytes(row[8]))
        elif row[7] is None:
            found.runs.append(row[:7])
        else:
            found.attempts.append((row[0], row[1], row[7], row[6]))
    return found


@functools.lru_cache(maxsize=64)
def _announce_sql(count: int) -> str:
    cases = " ".join(["WHEN ? THEN ?"] * count)
    return (
        f"UPDATE runs SET announced_status = CASE run_id {cases} END "
        f"WHERE run_id IN ({_marks(count)})"
    )


# Runs per statement: 3 parameters each stay far below either database's limit, and a
# CASE of a few hundred arms costs the server little per row.
ANNOUNCED_PER_STATEMENT = 256


def set_announced_statuses(statuses: dict[str, str]) -> None:
    """Record each run's announced lifecycle status (run id -> status): one statement
    for the runs of a commit, instead of one each."""
    pairs = list(statuses.items())
    for start in range(0, len(pairs), ANNOUNCED_PER_STATEMENT):
        chunk = pairs[start : start + ANNOUNCED_PER_STATEMENT]
        params: list[Any] = [value for pair in chunk for value in pair]
        execute_later(_announce_sql(len(chunk)), [*params, *(run_id for run_id, _ in chunk)])


# --- durable command receipts ----------------------------------------------------------

_COMMAND_COLUMNS = "request_fingerprint, outcome, accepted_revision, receipt_hash, error_hash"
# The commands stored for a request: by its id, or by its client's idempotency key.
_COMMANDS_OF_REQUEST = (
    "FROM host_commands WHERE request_id = ? OR (client_id = ? AND idempotency_key = ?)"
)
# `stored_commands` as a check that it finds nothing: the negated count has a square root
# only for 0, and fails for any other with a SQLSTATE of its own (the host's fence and a
# worker's claim check, which may travel with it, fail with others).
_CHECK_NOTHING_STORED = f"SELECT sqrt(-(SELECT count(*) {_COMMANDS_OF_REQUEST}))"
_STORED_COMMAND_FOUND = "2201F"  # invalid_argument_for_power_function


def stored_commands(
    request_id: str, client_id: str, idempotency_key: str
) -> tuple[tuple[Any, ...] | None, tuple[Any, ...] | None]:
    """The stored command with this request id, and the one with this client's
    idempotency key, each as ``(fingerprint, outcome, revision, receipt_hash,
    error_hash)`` or None; one read (a row that is both counts as the first)."""
    found = rows(
        f"SELECT request_id = ?, {_COMMAND_COLUMNS} {_COMMANDS_OF_REQUEST}",
        (request_id, request_id, client_id, idempotency_key),
    )
    by_id = next((tuple(row[1:]) for row in found if row[0]), None)
    by_key = next((tuple(row[1:]) for row in found if not row[0]), None)
    return by_id, by_key


def hold_nothing_stored_check(
    request_id: str, client_id: str, idempotency_key: str, failure: Callable[[], Exception]
) -> bool:
    """PostgreSQL, inside a transaction: that `stored_commands` would find nothing, as a
    check travelling with the transaction's next statement, which raises `failure()`
    when a command is stored; from then on the savepoint block it was held in (a start of
    a group commit), or else the transaction, cannot commit. False where it cannot
    travel: the caller reads."""
    check = HeldCheck(failure, _STORED_COMMAND_FOUND, in_block=True)
    return hold_check(_CHECK_NOTHING_STORED, (request_id, client_id, idempotency_key), check)


# --- rows a request inserts ------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _insert_sql(
    model: type[peewee.Model], names: tuple[str, ...]
) -> tuple[str, tuple[peewee.Field[Any], ...]]:
    fields = tuple(model._meta.fields[name] for name in names)
    columns = ", ".join(field.column_name for field in fields)
    sql = f"INSERT INTO {model._meta.table_name} ({columns}) VALUES ({_marks(len(fields))})"
    return sql, fields


def insert_row(model: type[peewee.Model], values: dict[str, Any], *, later: bool = False) -> None:
    """`model.create(**values)` without building the query each time: the model's
    defaults fill the fields `values` leaves out, each value is converted by its field.

    `later`: a row whose insert nothing relies on failing right here (a new run's rows,
    a request's receipt) travels with the transaction's next statement
    (`execute_later`); its failure surfaces there, in the same savepoint."""
    data = model._meta.get_default_dict()
    data.update(values)
    sql, fields = _insert_sql(model, tuple(data))
    params = [field.db_value(value) for field, value in zip(fields, data.values(), strict=True)]
    if later:
        execute_later(sql, params)
    else:
        execute(sql, params)
