"""PostgreSQL: statements the server plans once per connection, not once per call.

psycopg2 sends every statement as text, and the server parses and plans it each time:
a few hundredths of a millisecond for a key lookup, ~1.5 ms for the claim pass's
candidate query (four branches of three joins each, ~0.3 ms to run). A queued 3-node
run sends ~110 statements, and planning them cost the server ~6 ms per run, about as
much as running them (`pg_stat_statements` with `track_planning`), on the cores the
host and its workers share.

`run` sends a statement that is planned on this connection as ``EXECUTE name (values)``;
the server keeps it (``PREPARE``) for the connection's life. A statement is prepared
once it ran twice on a connection (one that runs once is not worth a round trip),
between two transactions (`prepare_wanted`, which the store calls when a transaction
ends): ``PREPARE`` is then a statement of its own, and a text the server cannot prepare
(a parameter whose type it cannot tell) fails there without failing a transaction, and
is run as it is from then on. A connection holds at most `MAX_PER_CONNECTION` of them.

A planned statement's parameters take the types the server infers from where they
stand, as the values of the text would: none may stand bare in what a query returns
(``SELECT %s`` would return text whatever the value).

Only statements that look rows up, or write them, by key go through `run` (the
hand-written ones of `statements`, and the `PreparedQuery`s marked ``planned``): every
connection opens with ``plan_cache_mode=force_generic_plan`` (by default the server
plans a prepared statement anew for its first five calls and for every later call whose
own plan it estimates cheaper, which for the candidate query is every call), and a plan
made without the values would do for a range only by chance. The candidate query's
generic plan walks the same queue index as the per-call one (measured with 3,000
queued runs), once the server knows the tables' size (`table_statistics`).

Outside a transaction the connection guard sends a statement again on a new connection
when the old one was lost; the new one holds no prepared statement, and the statement
then runs as it is. Elsewhere (SQLite, another driver) a statement runs as it is.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import peewee

from ..errors import DatabaseUnavailableError
from .deferred_statements import DeferredStatements
from .driver import run_sql, sqlstate

GENERIC_PLANS = "-c plan_cache_mode=force_generic_plan"
# IN lists of many lengths are statements of their own: enough room for the hot ones.
MAX_PER_CONNECTION = 64
# Calls on one connection before a statement is prepared for it.
CALLS_BEFORE_PREPARING = 2
# The server's SQLSTATE for an EXECUTE of a name the session does not hold.
UNKNOWN_PREPARED_STATEMENT = "26000"

log = logging.getLogger(__name__)

_numbers = itertools.count(1)
_lock = threading.Lock()
# The name each statement text is prepared under, the same on every connection.
_names: dict[str, str] = {}
# Texts the server refused to prepare: run as they are.
_refused: set[str] = set()


class _Plans:
    """What one connection holds: its prepared statements (by text), and how often each
    text not prepared yet ran on it."""

    def __init__(self) -> None:
        self.prepared: set[str] = set()
        self.calls: dict[str, int] = {}
        self.wanted: list[str] = []  # ran often enough: prepared after this transaction


_connections: weakref.WeakKeyDictionary[Any, _Plans] = weakref.WeakKeyDictionary()


def applies_to(db: peewee.Database) -> bool:
    """A PostgreSQL database through psycopg2, whose statements are plain text."""
    return DeferredStatements.applies_to(db)


def configure(db: peewee.Database) -> None:
    """Before `db` first connects: its prepared statements keep one plan."""
    options = db.connect_params.get("options", "")
    db.connect_params["options"] = f"{options} {GENERIC_PLANS}".strip()


def run(db: peewee.Database, sql: str, params: Sequence[Any]) -> Any:
    """Run `sql` (``%s`` placeholders) with `params`; returns its cursor. On PostgreSQL,
    a statement prepared on this connection is only executed."""
    # A closed connection is the connection guard's to open again (with its backoff).
    if not applies_to(db) or db.is_closed():
        return run_sql(db, sql, params)
    sent = to_send(db, sql)
    if sent is sql:
        return run_sql(db, sql, params)
    try:
        return db.execute_sql(sent, list(params))
    except peewee.DatabaseError as error:
        # Alone, a statement whose connection was lost is sent again on a new one (the
        # connection guard), which holds no prepared statement: then it runs as it is.
        if db.in_transaction() or sqlstate(error) != UNKNOWN_PREPARED_STATEMENT:
            raise
        return run_sql(db, sql, params)


def to_send(db: peewee.Database, sql: str) -> str:
    """What to send on PostgreSQL for `sql` with the same parameters: ``EXECUTE name
    (…)`` once it is prepared on this connection, else `sql` itself (this call counts
    toward preparing it, which happens when a transaction ends). A held write
    (`statements.run_later`) travels as the one or the other."""
    plans = _plans(db.connection())
    if sql not in plans.prepared:
        if sql not in _refused and len(plans.prepared) < MAX_PER_CONNECTION:
            calls = plans.calls[sql] = plans.calls.get(sql, 0) + 1
            if calls == CALLS_BEFORE_PREPARING:
                plans.wanted.append(sql)
        return sql
    parameters = sql.count("%s")
    arguments = f" ({', '.join(['%s'] * parameters)})" if parameters else ""
    return f"EXECUTE {_names[sql]}{arguments}"


def prepare_wanted(db: peewee.Database) -> None:
    """Outside a transaction: prepare, on `db`'s connection, the statements that ran
    often enough on it. Never raises (the store calls it right after a commit): a
    statement the server refuses runs as it is from then on, and any other failure
    leaves the rest for the next transaction's end."""
    if not applies_to(db) or db.in_transaction() or db.is_closed():
        return
    plans = _plans(db.connection())
    while plans.wanted:
        sql = plans.wanted.pop()
        plans.calls.pop(sql, None)
        if len(plans.prepared) >= MAX_PER_CONNECTION:
            plans.calls.clear()  # no room left: nothing more is prepared here
            plans.wanted.clear()
            return
        try:
            numbered = _numbered(sql)
            with _lock:
                name = _names.setdefault(sql, f"piw_planned_{next(_numbers)}")
            db.execute_sql(f"PREPARE {name} AS {numbered}")
        except (DatabaseUnavailableError, peewee.OperationalError, peewee.InterfaceError):
            plans.wanted.append(sql)  # the connection is in trouble: after the next one
            return
        except (ValueError, peewee.DatabaseError) as refusal:
            _refused.add(sql)  # not this text, on any connection
            log.debug("statement not prepared (%s): %s", refusal, sql)
            continue
        except Exception:  # a committed transaction must not fail here
            log.exception("preparing statements failed; they run as they are")
            plans.wanted.clear()
            return
        plans.prepared.add(sql)


def _plans(connection: Any) -> _Plans:
    plans = _connections.get(connection)
    if plans is None:
        plans = _connections[connection] = _Plans()
    return plans


def _numbered(sql: str) -> str:
    """`sql` with its ``%s`` placeholders numbered as PREPARE wants them ($1, $2, …)."""
    parts = sql.split("%s")
    if any("%" in part for part in parts):
        raise ValueError(f"a planned statement takes %s placeholders only: {sql!r}")
    numbered = [parts[0]]
    for number, part in enumerate(parts[1:], start=1):
        numbered.append(f"${number}{part}")
    return "".join(numbered)
