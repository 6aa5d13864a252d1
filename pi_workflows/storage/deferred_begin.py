"""PostgreSQL: a transaction's BEGIN travels with its first statement.

peewee sends BEGIN as a statement of its own: a round trip that returns nothing, one per
transaction (the host runs 7 to 20 of them per run, and its event loop waits for each).
Held back, it goes in front of the transaction's first statement, in the same query
text (psycopg2 sends a statement's text as it is, and the server runs both in order, as
it would have run them one by one); a transaction that ran no statement sends neither
BEGIN nor COMMIT. The server's transaction starts before that first statement either
way, so nothing it sees or locks changes.

Only for psycopg2, whose queries are plain text (a driver that binds parameters on the
server refuses two statements in one query); others keep peewee's own BEGIN.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import peewee


class _Pending(threading.local):
    # peewee keeps a connection, and its transaction, per thread: so does this.
    begin = False


class DeferredBegin:
    """Installed once on a database, right after opening (before its connection guard)."""

    def __init__(self, db: peewee.Database) -> None:
        self._pending = _Pending()
        self._execute_sql: Callable[..., Any] = db.execute_sql
        self._begin: Callable[..., None] = db.begin
        self._commit: Callable[[], Any] = db.commit
        self._rollback: Callable[[], Any] = db.rollback
        db.execute_sql = self._execute_sql_after_begin  # type: ignore[method-assign]
        db.begin = self._hold_begin  # type: ignore[method-assign]
        db.commit = self._commit_begun  # type: ignore[method-assign]
        db.rollback = self._roll_back_begun  # type: ignore[method-assign]
        self._isolation_level = getattr(db, "_isolation_level", None)

    @staticmethod
    def applies_to(db: peewee.Database) -> bool:
        adapter = getattr(db, "_adapter", None)  # peewee's driver adapter (not in its stubs)
        return isinstance(db, peewee.PostgresqlDatabase) and type(adapter).__name__ == (
            "Psycopg2Adapter"
        )

    def _hold_begin(self, *args: Any, **kwargs: Any) -> None:
        if args or kwargs or self._isolation_level:  # a BEGIN with options goes on its own
            self._begin(*args, **kwargs)
            return
        self._pending.begin = True

    def _execute_sql_after_begin(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        if self._pending.begin:
            self._pending.begin = False
            sql = f"BEGIN; {sql}"
        return self._execute_sql(sql, *args, **kwargs)

    def _commit_begun(self) -> Any:
        if self._pending.begin:  # no statement ran: the server has no transaction to end
            self._pending.begin = False
            return None
        return self._commit()

    def _roll_back_begun(self) -> Any:
        if self._pending.begin:
            self._pending.begin = False
            return None
        return self._rollback()
