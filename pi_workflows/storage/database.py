"""Opening the state database: schema checks, pragmas and re-entrant transactions."""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import peewee

from .. import plugins
from ..clock import now_ms
from ..errors import (
    DatabaseUnavailableError,
    DatabaseUrlError,
    NotFoundError,
    SchemaMismatchError,
    TransactionAborted,
    UnsafeHomeError,
)
from ..home import Home, check_private_dir, prepare_home
from . import (
    blobs,
    file_watch,
    known_attempts,
    revisions,
    run_transitions,
    server_plans,
)
from .connection_guard import ConnectionGuard
from .connection_use import ConnectionUse
from .deferred_statements import CommitRead, DeferredStatements
from .driver import run_sql
from .models import (
    ADDED_INDEXES,
    ALL_MODELS,
    DROPPED_INDEXES,
    TERMINAL_RUN_STATUSES,
    SchemaMeta,
    database_proxy,
)
from .schema_upgrade import UPGRADES, upgrade_schema
from .table_statistics import StatisticsKeeper

if TYPE_CHECKING:
    from ..testing.kill_point import KillPoint

# What SPEC §4 promises for every SQLite state database, whoever opened it: applied to
# each connection (`permanent=True`), so a storage plugin cannot forget one.
SQLITE_PRAGMAS = (
    ("journal_mode", "wal"),
    ("synchronous", "full"),
    ("foreign_keys", 1),
    ("busy_timeout", 5000),
)
# A read-only connection cannot set the journal mode; it refuses writes twice over.
SQLITE_READ_PRAGMAS = (("foreign_keys", 1), ("busy_timeout", 5000), ("query_only", 1))
# How long an opening retries a pragma SQLite refused at once with "database is locked".
PRAGMA_LOCKED_RETRY_S = 5.0

# Arms the test kit's kill point (pi_workflows.testing.kill_point); unset in production.
KILL_POINT_ENV = "PI_WORKFLOWS_TEST_KILL_POINT"

SCHEMA_NAME = "pi-workflows-state"
_SAVEPOINT = "piw_block"
# 2: run_queue.priority, runs.announced_status; 3: host_state one row per home,
# forwarded_commands (several hosts on PostgreSQL); 4: event types in one style
# (schema_upgrade.RENAMED_EVENTS); 5: nested_blobs (the blobs a stored value names, for
# pruning). Older versions that schema_upgrade.UPGRADES has a step for are upgraded on
# open.
SCHEMA_VERSION = 5

log = logging.getLogger("pi_workflows.storage")


class _TransactionState(threading.local):
    depth = 0
    doomed = False
    after_commit: list[Callable[[], None]]
    read: CommitRead | None = None  # behind the COMMIT (`read_with_commit`)

    def __init__(self) -> None:
        self.after_commit = []


class StateStore:
    """An open state database. Models are bound to it while it is open.

    One store is open per process at a time (the models share one database proxy).
    """

    def __init__(
        self, db: peewee.Database, home: Home, url: str | None, *, location: str | None = None
    ) -> None:
        self.db = db
        self.home = home
        self.url = url
        self._location = location or describe_location(db)
        # The version the database holds: the current one, unless it was opened read-only
        # and needs an upgrade.
        self.schema_version = SCHEMA_VERSION
        self._tx = _TransactionState()
        # Run first in every outermost transaction when set: a host on a shared database
        # refuses to write once its lease has expired (SPEC §14). Its argument: whether
        # the check may travel with the transaction's first statement (`transaction`).
        self.fence: Callable[[bool], None] | None = None
        self._deferred: list[Callable[[], None]] = []
        # The test kit's crash-point explorer only (PI_WORKFLOWS_TEST_KILL_POINT): told of
        # each commit that changed a run, right before and right after it.
        self.kill_point: KillPoint | None = None
        # Under the guard: a lost held statement is a lost statement.
        self.held_statements = DeferredStatements(db) if DeferredStatements.applies_to(db) else None
        # A writing store's tables' statistics while they grow (set by open_state).
        self.statistics: StatisticsKeeper | None = None
        self.connection_use = ConnectionUse(db)
        # A server database's connection can be lost and come back; a file's cannot.
        self.connection_guard = None if self.is_sqlite else ConnectionGuard(db)
        # A SQLite file deleted or replaced under the store (set by open_state).
        self.file_watch: file_watch.SqliteFileWatch | None = None
        # When a write last failed for lack of disk space (epoch ms; 0: it has room).
        self.disk_full_since = 0
        # Outermost transactions committed so far: what a read made at one commit
        # (`read_with_commit`) may still stand for only while this has not moved.
        self.commits = 0

    @property
    def is_sqlite(self) -> bool:
        return isinstance(self.db, peewee.SqliteDatabase)

    @property
    def unavailable(self) -> str:
        """Why the database cannot be reached right now, or '' while it can."""
        if self.file_watch is not None:
            with contextlib.suppress(DatabaseUnavailableError):
                self.file_watch.check()
            return self.file_watch.gone
        return self.connection_guard.describe() if self.connection_guard is not None else ""

    @property
    def commits_may_have_gone_unheard(self) -> bool:
        """Whether a COMMIT of this store may have committed unheard: its server
        connection was lost at least once (PostgreSQL). Never on SQLite, whose commit
        succeeds or fails in this process."""
        return self.connection_guard is not None and self.connection_guard.ever_lost

    @property
    def location(self) -> str:
        """Where the data lives, without credentials."""
        return self._location

    @contextlib.contextmanager
    def transaction(self, *, fence_later: bool = False) -> Iterator[None]:
        """A write transaction; an inner call joins the outer one.

        SQLite takes the write lock up front (``BEGIN IMMEDIATE``) so two writers queue on
        ``busy_timeout`` instead of failing on lock upgrade. If an inner block raises, the
        whole transaction is doomed: even if the caller swallows the error, the outermost
        block rolls back and raises :class:`TransactionAborted`.

        `fence_later`: the fence (a host on a shared database) may be checked with the
        transaction's first statement instead of before the block runs, for a block that
        does nothing outside the database before its first statement.
        """
        tx = self._tx
        if tx.depth:
            tx.depth += 1
            try:
                yield
            except BaseException:
                tx.doomed = True
                raise
            finally:
                tx.depth -= 1
            return
        guard = self.connection_guard
        if guard is not None:
            guard.ensure_connected()
            guard.check_idle()
        if self.file_watch is not None:
            self.file_watch.check()
        begin = self.db.atomic(lock_type="IMMEDIATE") if self.is_sqlite else self.db.atomic()
        tx.depth, tx.doomed, tx.after_commit, tx.read = 1, False, [], None
        run_transitions.forget()
        blobs.transaction_began()
        revisions.transaction_began()
        known_attempts.transaction_began()
        committed = False
        deferred: list[Callable[[], None]] = []
        try:
            with begin:
                if self.fence is not None:
                    self.fence(fence_later)
                deferred, self._deferred = self._deferred, []
                for write in deferred:
                    write()
                yield
                if tx.doomed:
                    raise TransactionAborted(
                        "An inner step of this change failed, so nothing was written; "
                        "see the earlier error."
                    )
                taken_up = blobs.take_unchecked()
                if self.kill_point is not None:
                    self.kill_point.committing(*run_transitions.noted())
                # The blobs the transaction took up are read (and held) with what it
                # announces: one round trip, not two.
                transitions, attempt_changes, stored = run_transitions.collect(
                    now_ms(), heard=plugins.node_attempts_heard, blob_hashes=list(taken_up)
                )
                blobs.check_read(taken_up, stored)
                # Announced before the callbacks the transaction registered (a claim pass,
                # say), so a plugin hears of a change before what follows from it.
                tx.after_commit[:0] = _announcements(transitions, attempt_changes)
            committed = True
            self.commits += 1
            if tx.read is not None:
                tx.read.commit_number = self.commits
            if self.disk_full_since:
                log.warning(
                    "writes to %s go on: the disk has room again after %.1f s",
                    self.location,
                    (now_ms() - self.disk_full_since) / 1000,
                )
                self.disk_full_since = 0
            if self.kill_point is not None:
                self.kill_point.committed()
        except BaseException as error:
            if not committed:
                # Rolled back, or the commit itself failed (a full disk): the deferred
                # writes wait for the next transaction.
                self._deferred[:0] = deferred
            if not self.disk_full_since and is_disk_full(error):
                self.disk_full_since = now_ms()
                log.warning("the disk under %s is full: nothing more is written", self.location)
            tx.after_commit = []
            run_transitions.forget()
            if guard is not None and not isinstance(error, DatabaseUnavailableError):
                # The connection broke under the transaction (its rollback then fails
                # too): whatever surfaced, the caller hears that the server is gone.
                if isinstance(error, peewee.PeeweeException) and guard.is_lost():
                    guard.mark_lost(error)
                    raise guard.error() from error
            raise
        finally:
            tx.depth, tx.read = 0, None
            blobs.transaction_ended(committed)
            revisions.transaction_ended()
            known_attempts.transaction_ended(committed)
        if self.held_statements is not None:  # PostgreSQL through psycopg2
            # Between transactions: what ran often enough is planned once.
            server_plans.prepare_wanted(self.db)
            if self.statistics is not None:
                self.statistics.committed(self.commits)
        callbacks, tx.after_commit = tx.after_commit, []
        for callback in callbacks:
            callback()

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """Inside a transaction: a block whose failure undoes only its own writes.

        Unlike an inner `transaction()`, an error here does not doom the transaction: it
        rolls back to the start of the block, drops the block's after-commit callbacks
        and propagates; the caller may catch it and go on writing (group commit).
        """
        tx = self._tx
        if not tx.depth:
            raise RuntimeError("savepoint() needs an open transaction")
        callbacks, doomed, blobs_written = len(tx.after_commit), tx.doomed, blobs.written_mark()
        held = self.held_statements
        mark = None
        if held is not None:
            mark = held.open_savepoint(_SAVEPOINT)
        else:
            self.db.execute_sql(f"SAVEPOINT {_SAVEPOINT}")
        tx.depth += 1
        blobs.block_began()
        try:
            try:
                yield
                blobs.check_taken_up()  # a conflict found here undoes this block alone
            finally:
                tx.depth -= 1
                blobs.block_ended()
            # Inside the failure handling: a held write that fails with the release
            # undoes this block alone.
            if held is not None and mark is not None:
                held.release_savepoint(_SAVEPOINT, mark)
            else:
                self.db.execute_sql(f"RELEASE SAVEPOINT {_SAVEPOINT}")
        except BaseException:
            if held is not None and mark is not None:
                held.roll_back_savepoint(_SAVEPOINT, mark)
            else:
                self.db.execute_sql(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
                self.db.execute_sql(f"RELEASE SAVEPOINT {_SAVEPOINT}")
            del tx.after_commit[callbacks:]
            blobs.rolled_back_to(blobs_written)
            revisions.rolled_back()
            known_attempts.rolled_back()
            tx.doomed = doomed
            raise

    def defer_write(self, write: Callable[[], None]) -> None:
        """A bookkeeping write that may wait: it runs first in the next outermost
        transaction (see `flush_deferred`), sparing a commit of its own."""
        self._deferred.append(write)

    def flush_deferred(self) -> None:
        """Commit the writes `defer_write` holds, if any."""
        if self._deferred:
            with self.transaction():
                pass

    @property
    def in_transaction(self) -> bool:
        return self._tx.depth > 0

    def read_with_commit(
        self, build: Callable[[set[str]], tuple[str, Sequence[Any]]], key: str
    ) -> CommitRead | None:
        """Inside a transaction on PostgreSQL: read what `build` makes of the keys asked
        for, behind this transaction's ``COMMIT`` and in its round trip, instead of in a
        round trip of its own after it. Its `rows` are set once the transaction
        committed (its `commit_number` too: they stand for the database while
        `commits` still equals it). `build` gets every key this transaction asked with
        it; one read per transaction (another `build` gets None). None elsewhere: SQLite
        reads in the process, so the caller just reads after the commit."""
        held, tx = self.held_statements, self._tx
        if held is None or not tx.depth:
            return None
        read = held.read_with_commit(build, key)
        if read is not None:
            tx.read = read
        return read

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run `callback` once the outermost transaction commits (never on rollback)."""
        if not self._tx.depth:
            callback()
            return
        self._tx.after_commit.append(callback)

    def close(self) -> None:
        if self.statistics is not None:
            self.statistics.close()
        if not self.db.is_closed():
            self.db.close()


def describe_location(db: peewee.Database) -> str:
    """A database's place for messages and status output, without credentials."""
    if isinstance(db, peewee.SqliteDatabase):
        return str(db.database)
    return f"postgresql database {db.database!r}"


def masked_url(url: str) -> str:
    """`url` with its password (if any) replaced by ``***``, for messages and status."""
    try:
        parts = urlsplit(url)
        password, port = parts.password, parts.port
    except ValueError:  # not a URL we can take apart: say nothing of what follows the '@'
        return url.rsplit("@", 1)[-1]
    if password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port_text = f":{port}" if port else ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port_text}"))


def _announcements(
    transitions: list[run_transitions.RunTransition],
    attempts: list[run_transitions.AttemptChange],
) -> list[Callable[[], None]]:
    """One commit's notifications in the order things happened: a run starts running
    before its nodes start, and its nodes finish before it ends."""
    ending = [t for t in transitions if t.new_status in TERMINAL_RUN_STATUSES]
    return [
        *(functools.partial(_announce, t) for t in transitions if t not in ending),
        *(functools.partial(plugins.node_attempt_changed, a.phase, a.attempt) for a in attempts),
        *(functools.partial(_announce, t) for t in ending),
    ]


def _announce(transition: run_transitions.RunTransition) -> None:
    plugins.run_transition(
        transition.run_id,
        transition.old_status,
        transition.new_status,
        transition.detail,
        workflow_name=transition.workflow_name,
        at=transition.at,
    )


def _refuse_foreign_sqlite(path: Path) -> None:
    """Check an existing SQLite file read-only, so a foreign database is never written."""
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise SchemaMismatchError(f"Cannot open {path}: {exc}.") from exc
    try:
        tables = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if not tables:
            return
        meta = None
        if "schema_meta" in tables:
            meta = conn.execute(
                "SELECT schema_name, schema_version FROM schema_meta WHERE id = 1"
            ).fetchone()
    except sqlite3.DatabaseError as exc:
        raise SchemaMismatchError(
            f"{path} is not a readable pi-workflows database ({exc}); move it aside and start "
            "again."
        ) from exc
    finally:
        conn.close()
    check_schema_meta(meta, str(path), is_sqlite=True, upgradable=True)


def check_schema_meta(
    meta: tuple[str, int] | None, where: str, *, is_sqlite: bool, upgradable: bool = False
) -> None:
    """Refuse, in one line, a database this pi-workflows cannot use as it is.

    With `upgradable`, an older version that `schema_upgrade` can upgrade passes.
    """
    from .. import __version__

    if meta is None:
        raise SchemaMismatchError(
            f"{where} holds tables but no pi-workflows schema_meta row; it is not a "
            "pi-workflows state database. Point --database elsewhere or move it aside."
        )
    name, version = meta
    if name == SCHEMA_NAME and (version == SCHEMA_VERSION or (upgradable and version in UPGRADES)):
        return
    if name == SCHEMA_NAME and version > SCHEMA_VERSION:
        raise SchemaMismatchError(
            f"{where} has schema v{version}, newer than this pi-workflows {__version__} "
            f"reads (v{SCHEMA_VERSION}); upgrade pi-workflows to open it."
        )
    if is_sqlite:
        reset = "back it up ('pi-workflows state backup DEST' or copy the file), then move it aside"
    else:
        reset = "back it up with pg_dump, then point --database at a new, empty database"
    raise SchemaMismatchError(
        f"{where} has schema {name} v{version}, which this pi-workflows cannot upgrade (it "
        f"needs {SCHEMA_NAME} v{SCHEMA_VERSION}); {reset} and start again."
    )


def is_disk_full(error: BaseException) -> bool:
    """The database (or the filesystem under it) has no room for a write.

    Looks down the exception chain: SQLite rolls a full transaction back itself, so the
    error that surfaces may be the failed rollback after it.
    """
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        text = str(seen).lower()
        if isinstance(seen, peewee.DatabaseError) and (
            "disk is full" in text or "no space left" in text
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _existing_schema_version(store: StateStore) -> int | None:
    """The version of the schema the database holds (None: no tables yet).

    Refuses a foreign database, and a version that is neither current nor upgradable.
    """
    existing = set(store.db.get_tables())
    if not existing:
        return None
    meta = None
    if "schema_meta" in existing:
        row = SchemaMeta.get_or_none(SchemaMeta.id == 1)
        meta = (row.schema_name, row.schema_version) if row else None
    check_schema_meta(meta, store.location, is_sqlite=store.is_sqlite, upgradable=True)
    assert meta is not None
    return meta[1]


def _initialize_schema(store: StateStore) -> None:
    from .. import __version__

    db = store.db
    version = _existing_schema_version(store)
    if version == SCHEMA_VERSION:
        reconcile_indexes(db)
        return
    if version is not None:
        with store.transaction():
            upgrade_schema(db, store.home, store.location, SCHEMA_VERSION)
        reconcile_indexes(db)
        return
    with store.transaction():
        # Another process may have created the schema while this one waited for the
        # write lock: look again under the lock before creating anything.
        if _existing_schema_version(store) is not None:
            return
        db.create_tables(ALL_MODELS)
        stamp = now_ms()
        SchemaMeta.create(
            id=1,
            schema_name=SCHEMA_NAME,
            schema_version=SCHEMA_VERSION,
            app_version=__version__,
            created_at=stamp,
            updated_at=stamp,
        )


def reconcile_indexes(db: peewee.Database) -> None:
    """Drop the indexes that went since the schema version was released (`DROP INDEX IF
    EXISTS`) and create those added since that `db` lacks (`CREATE INDEX IF NOT EXISTS`):
    two processes opening it at once both succeed."""
    existing = index_names(db)
    for name in DROPPED_INDEXES:
        if name in existing:
            db.execute_sql(f"DROP INDEX IF EXISTS {name}")
    for model, index in ADDED_INDEXES:
        if index._name not in existing:  # type: ignore[attr-defined]  # not in stubs
            # Through the schema manager, as create_tables does: it spells a partial
            # index's WHERE values out, since SQLite refuses parameters there.
            db.execute(model._schema._create_index(index, safe=True))  # type: ignore[attr-defined]  # not in stubs


def index_names(db: peewee.Database) -> set[str]:
    """The names of the indexes of `db`'s tables, read at once where the kind of database
    allows. A store opened to write an existing database reads them; peewee's
    `get_indexes` takes one query per table (on PostgreSQL a catalog join that also spells
    out each index's columns): 26 ms instead of 0.7 on a local server."""
    if isinstance(db, peewee.SqliteDatabase):
        query = "SELECT name FROM sqlite_master WHERE type = 'index'"
    elif isinstance(db, peewee.PostgresqlDatabase):
        query = "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
    else:
        return index_names_by_table(db)
    return {name for (name,) in run_sql(db, query, ()).fetchall()}


def index_names_by_table(db: peewee.Database) -> set[str]:
    """The names of the indexes of the tables that have added indexes, one query per
    table: any other kind of database a storage plugin returns."""
    tables = {model._meta.table_name for model, _ in ADDED_INDEXES}
    return {row.name for table in tables for row in db.get_indexes(table)}


def open_state(
    home: Home,
    url: str | None = None,
    *,
    read_only: bool = False,
    idle_transaction_limit_ms: int | None = None,
) -> StateStore:
    """Open (and on first use create) the state database of `home`.

    Refuses an unsafe home, a database of another schema version (before writing
    anything) and URLs no storage plugin understands. With `read_only` (commands that
    only look) nothing is created or upgraded and every write fails: SQLite opens the file
    with ``mode=ro`` and ``query_only``, PostgreSQL runs every transaction read-only. A
    database that needs an upgrade is then opened as it is (`StateStore.schema_version`
    says which it has); one with no state yet is `NotFoundError`.

    With `idle_transaction_limit_ms` (the host: its lease), a PostgreSQL server ends a
    session that sits in an open transaction that long, and with it the locks the
    transaction held.
    """
    if read_only:  # the same checks as prepare_home, on what exists: nothing is created
        for directory in (home.root, home.host_dir):
            if directory.exists():
                check_private_dir(directory)
    else:
        prepare_home(home)
    db = plugins.open_database(url, home.root)
    if db is None:
        raise DatabaseUrlError(
            f"No storage plugin can open {masked_url(url or '')!r}; check --database."
        )
    location = describe_location(db)
    if isinstance(db, peewee.SqliteDatabase):
        path = _durable_sqlite_path(db)
        _refuse_foreign_sqlite(path)
        if read_only:
            if not path.exists():
                raise NotFoundError(_NO_STATE_YET.format(where=path))
            _open_sqlite_read_only(db, path)
        elif not path.exists():
            file_watch.refuse_missing(home, path)
            fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
    elif read_only:
        _open_postgresql_read_only(db)
    if idle_transaction_limit_ms is not None and isinstance(db, peewee.PostgresqlDatabase):
        _limit_idle_transactions(db, idle_transaction_limit_ms)
    if server_plans.applies_to(db):
        server_plans.configure(db)
    database_proxy.initialize(db)
    try:
        db.connect(reuse_if_open=True)
    except peewee.OperationalError as exc:
        where = masked_url(url) if url else location
        raise DatabaseUrlError(f"Cannot connect to {where}: {exc}".strip()) from exc
    if isinstance(db, peewee.SqliteDatabase):
        for pragma, value in SQLITE_READ_PRAGMAS if read_only else SQLITE_PRAGMAS:
            _set_pragma(db, pragma, value)
    store = StateStore(db, home, url, location=location)
    if read_only:
        existing_version = _existing_schema_version(store)
        if existing_version is None:
            store.close()
            raise NotFoundError(_NO_STATE_YET.format(where=location))
        store.schema_version = existing_version
    else:
        _initialize_schema(store)
        if store.held_statements is not None:  # PostgreSQL through psycopg2
            store.statistics = StatisticsKeeper(db)
        if isinstance(db, peewee.SqliteDatabase):
            path = _durable_sqlite_path(db)
            file_watch.record_database(home, path)
            store.file_watch = file_watch.SqliteFileWatch(path)
        if os.environ.get(KILL_POINT_ENV):
            from ..testing.kill_point import armed_kill_point

            store.kill_point = armed_kill_point()
    return store


def _set_pragma(db: peewee.SqliteDatabase, pragma: str, value: object) -> None:
    """Set `pragma` on `db` and on each connection it opens later.

    Processes that open a fresh file at once all switch it to WAL: one that holds a read
    lock while another holds the write lock gets "database is locked" at once, without
    the busy timeout (SQLite's deadlock rule); a moment later the switch is done and the
    pragma goes through.
    """
    deadline = time.monotonic() + PRAGMA_LOCKED_RETRY_S
    while True:
        try:
            db.pragma(pragma, value, permanent=True)
            return
        except peewee.OperationalError as error:
            if "database is locked" not in str(error) or time.monotonic() > deadline:
                raise
        time.sleep(0.01)


_NO_STATE_YET = (
    "{where} holds no pi-workflows state yet; the first host creates it "
    "('pi-workflows host start', or any 'run start')."
)


def _durable_sqlite_path(db: peewee.SqliteDatabase) -> Path:
    """The file of a SQLite state database; refuses one that would not keep the state
    (in memory) or whose directory others can write to (they could swap the file, or put
    their own -wal or -shm file beside it, as in a shared /tmp)."""
    name = str(db.database)
    if name in ("", ":memory:") or "mode=memory" in name:
        raise DatabaseUrlError(
            f"The storage plugin opened an in-memory SQLite database ({name!r}), which "
            "loses every run when the host stops; return a SqliteDatabase with a file path."
        )
    path = Path(name)
    directory = path.parent
    mode = directory.stat().st_mode if directory.is_dir() else 0
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeHomeError(
            f"The state database's directory {directory} is writable by other users (mode "
            f"{stat.S_IMODE(mode):o}); move the database to a directory of your own, or run "
            f"'chmod 700 {directory}'."
        )
    return path


def _open_sqlite_read_only(db: peewee.SqliteDatabase, path: Path) -> None:
    """Every connection of `db` opens the file read-only: a write fails in SQLite itself."""
    db.database = f"{path.as_uri()}?mode=ro"
    db.connect_params["uri"] = True


def _limit_idle_transactions(db: peewee.Database, limit_ms: int) -> None:
    """Every session of `db` ends once it sits in an open transaction for `limit_ms`.

    Every fenced transaction of a host holds its own host row `FOR SHARE`, so that a
    takeover waits for it. A host stopped inside one (a paused machine, SIGSTOP) would
    otherwise hold that row, and every other host's takeover of it, for as long as it is
    stopped. A limit the storage plugin's URL sets stays.
    """
    options = db.connect_params.get("options", "")
    if "idle_in_transaction_session_timeout" not in options:
        limit = f"-c idle_in_transaction_session_timeout={limit_ms}"
        db.connect_params["options"] = f"{options} {limit}".strip()


def _open_postgresql_read_only(db: peewee.Database) -> None:
    """Every transaction of every connection of `db` is read-only (the server refuses
    writes), whatever the storage plugin's own connection options."""
    options = db.connect_params.get("options", "")
    db.connect_params["options"] = f"{options} -c default_transaction_read_only=on".strip()
