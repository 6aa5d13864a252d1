"""Noticing a lost database server connection and reconnecting with backoff.

A PostgreSQL server that restarts (or drops the host's connection) leaves a dead
connection behind; without this, every later query fails with "connection already
closed" for good. The guard wraps the database's `execute_sql`: a failure on a broken
connection marks the database unavailable (since when, and why); while it is, work is
refused at once with :class:`DatabaseUnavailableError` instead of waiting on the server,
and a new connection is tried, at most once per backoff period (doubling to a cap).

SQLite has no server connection to lose, so its stores have no guard.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import peewee

from ..clock import now_ms
from ..errors import DatabaseUnavailableError

log = logging.getLogger("pi_workflows.storage")

FIRST_RETRY_S = 0.25
MAX_RETRY_S = 2.0
# A transaction on a connection idle this long first checks it (one round trip), so a
# server restart while the host was idle costs no request; a busy connection is known
# to work.
IDLE_CHECK_S = 1.0


def _utc_time(stamp_ms: int) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(stamp_ms / 1000))


class ConnectionGuard:
    """Watches one database's server connection (install it once, right after opening)."""

    def __init__(self, db: peewee.Database) -> None:
        self.db = db
        #: when the connection was found lost (epoch ms), None while it works.
        self.unavailable_since: int | None = None
        self.cause = ""
        #: whether the connection was ever lost: a COMMIT sent then may have committed
        #: without the host hearing of it.
        self.ever_lost = False
        self._retry_s = FIRST_RETRY_S
        self._next_try = 0.0  # monotonic time of the next reconnect attempt
        self._last_used = time.monotonic()
        #: called after a reconnect, before the first statement runs on it.
        self.on_reconnect: Callable[[], None] | None = None
        self._execute_sql: Callable[..., Any] = db.execute_sql
        db.execute_sql = self._guarded_execute_sql  # type: ignore[method-assign]

    def describe(self) -> str:
        """The one-line state for status output and errors ('' while available)."""
        if self.unavailable_since is None:
            return ""
        return (
            f"The database is unavailable since {_utc_time(self.unavailable_since)} "
            f"({self.cause}); the host reconnects on its own and answers again once it is back."
        )

    def error(self) -> DatabaseUnavailableError:
        return DatabaseUnavailableError(self.describe())

    def ensure_connected(self) -> None:
        """Reconnect a lost connection if its backoff allows; refuse while it cannot."""
        if self.unavailable_since is None or self.db.in_transaction():
            return
        if time.monotonic() < self._next_try:
            raise self.error()
        with contextlib.suppress(Exception):  # the dead connection may fail to close
            self.db.close()
        try:
            self.db.connect()
        except peewee.DatabaseError as error:
            self.cause = _first_line(error)
            self._next_try = time.monotonic() + self._retry_s
            self._retry_s = min(self._retry_s * 2, MAX_RETRY_S)
            raise self.error() from error
        down_for = (now_ms() - self.unavailable_since) / 1000
        log.warning("database connection restored after %.1f s", down_for)
        self.unavailable_since, self.cause = None, ""
        self._retry_s, self._next_try = FIRST_RETRY_S, 0.0
        if self.on_reconnect is not None:
            self.on_reconnect()

    def check_idle(self) -> None:
        """Before a transaction: make sure a connection idle for a while still works."""
        if self.unavailable_since is None and time.monotonic() - self._last_used > IDLE_CHECK_S:
            self._guarded_execute_sql("SELECT 1")

    def is_lost(self) -> bool:
        """True when the underlying connection is broken (psycopg2: `closed` non-zero)."""
        if self.unavailable_since is not None:
            return True
        connection = self.db._state.conn  # type: ignore[attr-defined]  # not in peewee's stubs
        return connection is not None and bool(getattr(connection, "closed", 0))

    def mark_lost(self, error: BaseException) -> None:
        self.ever_lost = True
        if self.unavailable_since is None:
            self.unavailable_since = now_ms()
            self.cause = _first_line(error)
            self._retry_s, self._next_try = FIRST_RETRY_S, 0.0
            log.error("database connection lost: %s", self.cause)

    def _guarded_execute_sql(self, sql: str, params: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._attempt(sql, params, *args, **kwargs)
        except DatabaseUnavailableError:
            # A statement on its own is tried once more on a new connection: the server
            # may be back already (a restart drops the connection of an idle host). One
            # inside a transaction is not: what the transaction did before it is gone.
            if self.db.in_transaction():
                raise
            return self._attempt(sql, params, *args, **kwargs)

    def _attempt(self, sql: str, params: Any, *args: Any, **kwargs: Any) -> Any:
        self.ensure_connected()
        if self.unavailable_since is not None:  # in a transaction on a dead connection
            raise self.error()
        try:
            cursor = self._execute_sql(sql, params, *args, **kwargs)
        except (peewee.OperationalError, peewee.InterfaceError) as error:
            if not self.is_lost():
                raise
            self.mark_lost(error)
            raise self.error() from error
        self._last_used = time.monotonic()
        return cursor


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
