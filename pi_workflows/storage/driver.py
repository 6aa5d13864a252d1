"""One SQL text on the open database, past peewee's per-call overhead."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import peewee

# The driver's errors as peewee's own. peewee's stubs leave out this module attribute,
# `peewee.logger` and `Database._execute_cursor` below.
_DRIVER_ERRORS = peewee.__exception_wrapper__  # type: ignore[attr-defined]
_PEEWEE_LOG: logging.Logger = peewee.logger  # type: ignore[attr-defined]


@functools.cache
def _executes_as_peewee_does(database_class: type[peewee.Database]) -> bool:
    base = peewee.Database
    return (
        database_class.execute_sql is base.execute_sql
        and database_class._execute_cursor is base._execute_cursor  # type: ignore[attr-defined]
        and database_class.cursor is base.cursor
    )


def run_sql(db: peewee.Database, sql: str, params: Sequence[Any]) -> Any:
    """`db.execute_sql(sql, params)`, without its per-call logging and hook checks when
    nothing would see them (the host runs ~130 statements per queued run).

    A database class or instance that changes how statements run, query hooks and
    peewee's debug log all get the full `execute_sql`; errors are peewee's either way.
    """
    if (
        db.query_hooks
        or "execute_sql" in vars(db)  # wrapped by the connection guard (a server database)
        # mypy reads a class's __hash__ as the instance method and calls it unhashable
        or not _executes_as_peewee_does(type(db))  # type: ignore[arg-type]
        or _PEEWEE_LOG.isEnabledFor(logging.DEBUG)
    ):
        return db.execute_sql(sql, params)
    with _DRIVER_ERRORS:
        cursor = db.cursor()
        cursor.execute(sql, params)
    return cursor


def sqlstate(error: BaseException) -> str | None:
    """The server's SQLSTATE of a driver error, however peewee wrapped it."""
    seen: BaseException | None = error
    while seen is not None:
        code = getattr(seen, "pgcode", None)
        if code is not None:
            return str(code)
        seen = seen.__cause__ or seen.__context__
    return None
