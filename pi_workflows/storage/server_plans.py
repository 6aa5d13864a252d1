"""PostgreSQL: statements the server plans once per connection, not once per call.

psycopg2 sends every statement as text, and the server parses and plans it each time.
For most statements that costs a few hundredths of a millisecond; the claim pass's
candidate query (four branches of three joins each) takes ~1.5 ms to plan and ~0.3 ms to
run, and a run meets it four times, in the host's event loop. `run_planned` prepares
such a statement once on each connection (``PREPARE``: the server keeps it for the
connection's life, whatever becomes of the transaction it was made in) and from then on
sends ``EXECUTE`` with the values.

`configure` opens every connection with ``plan_cache_mode=force_generic_plan``: by
default the server plans a prepared statement anew for its first five calls and for
every later call whose own plan it estimates cheaper, which for the candidate query is
every call. Its generic plan walks the same queue index as the per-call one (measured
with 3,000 queued runs). The setting concerns prepared statements only, and pi-workflows
prepares no other.

Elsewhere (SQLite, another driver) a statement runs as it is.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from typing import Any

import peewee

from .deferred_statements import DeferredStatements
from .statements import run_sql

GENERIC_PLANS = "-c plan_cache_mode=force_generic_plan"

_numbers = itertools.count(1)
# The name each statement text is prepared under, the same on every connection.
_names: dict[str, str] = {}
# The statements each open connection holds, by name.
_prepared: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def applies_to(db: peewee.Database) -> bool:
    """A PostgreSQL database through psycopg2, whose statements are plain text."""
    return DeferredStatements.applies_to(db)


def configure(db: peewee.Database) -> None:
    """Before `db` first connects: its prepared statements keep one plan."""
    options = db.connect_params.get("options", "")
    db.connect_params["options"] = f"{options} {GENERIC_PLANS}".strip()


def run_planned(db: peewee.Database, sql: str, params: Sequence[Any]) -> Any:
    """Run `sql` (``%s`` placeholders) with `params`; returns its cursor. On PostgreSQL,
    inside a transaction, the server plans it once per connection.

    Outside a transaction a statement may be sent again on a new connection (the
    connection guard's retry), which holds none: it runs as it is.
    """
    if not applies_to(db) or not db.in_transaction():
        return run_sql(db, sql, params)
    name = _names.get(sql)
    if name is None:
        name = _names.setdefault(sql, f"piw_planned_{next(_numbers)}")
    connection = db.connection()
    held = _prepared.setdefault(connection, set())
    if name not in held:
        # A round trip of its own, once: the statement is known to exist only once this
        # one succeeded (a failure later in the same query text would leave it unknown).
        db.execute_sql(f"PREPARE {name} AS {_numbered(sql)}")
        held.add(name)
    arguments = f" ({', '.join(['%s'] * len(params))})" if params else ""
    return db.execute_sql(f"EXECUTE {name}{arguments}", list(params))


def _numbered(sql: str) -> str:
    """`sql` with its ``%s`` placeholders numbered as PREPARE wants them ($1, $2, …)."""
    parts = sql.split("%s")
    if any("%" in part for part in parts):
        raise ValueError(f"a planned statement takes %s placeholders only: {sql!r}")
    numbered = [parts[0]]
    for number, part in enumerate(parts[1:], start=1):
        numbered.append(f"${number}{part}")
    return "".join(numbered)
