"""PostgreSQL: statistics for the tables a store fills, while autovacuum has yet to look.

The server plans a prepared statement once, from what it knows of the tables then
(`server_plans`: generic plans), and plans it again only when those tables' statistics
change. On a new database it knows nothing: its tables are nearly empty when the host
first prepares its statements, and autovacuum analyzes a table at the earliest a
minute later (``autovacuum_naptime``). Until then the plans made for empty tables
stay, however the tables grow: a commit's read of a few blobs by key scanned the whole
`blobs` table (the plan of a one-page table), and each claim pass read and sorted every
queued run (the plan of a queue of one). Over 1,500 queued runs on a new database that
was 3.7 ms a commit read and 4.8 ms a claim pass, against 0.13 and 0.40 ms planned for
the tables' size (`pg_stat_statements`; docs/performance.md).

So a store on PostgreSQL, after its 64th commit and each time its commits have grown
fourfold since (256, 1,024, …), analyzes the tables that have more than doubled since
they were last analyzed, on a connection of its own in a thread of its own, so its
transactions wait for nothing. An ``ANALYZE`` makes every session plan the statements
on that table anew, with what it found. Once the tables are large, autovacuum (which
looks at a table once a tenth of it changed) keeps their statistics current, and this
seldom finds a table to analyze; a database user that does not own the tables gets a
warning from the server and no statistics, as before.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import peewee

from .models import ALL_MODELS

log = logging.getLogger(__name__)

FIRST_ANALYZE_AT = 64  # commits of one store
ANALYZE_GROWTH = 4
THREAD_NAME = "piw-table-statistics"

# The state's tables that have grown to more than twice the pages they had when last
# analyzed or vacuumed (relpages; 0 for one never looked at): their size on disk is
# current, unlike the server's counts of changed rows, which each session reports when
# it gets round to it. Other tables of the schema are not the store's to analyze.
_GROWN_TABLES = (
    "SELECT c.relname FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace "
    "AND c.relkind = 'r' AND c.relname = ANY(%s) "
    "AND pg_relation_size(c.oid) / current_setting('block_size')::int "
    "> 2 * greatest(c.relpages, 0) ORDER BY c.relname"
)
_STATE_TABLES = sorted(model._meta.table_name for model in ALL_MODELS)


class StatisticsKeeper:
    """Analyzes a store's grown tables on a schedule of its commits (`committed`)."""

    def __init__(self, db: peewee.Database) -> None:
        self._db = db
        self._next_at = FIRST_ANALYZE_AT
        self._thread: threading.Thread | None = None
        self.passes = 0  # started so far

    def committed(self, commits: int) -> None:
        """The store's `commits`-th commit is done: analyze if the schedule says so and
        no earlier pass still runs."""
        if commits < self._next_at:
            return
        while self._next_at <= commits:
            self._next_at *= ANALYZE_GROWTH
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._analyze, name=THREAD_NAME, daemon=True)
        self._thread.start()
        self.passes += 1

    def close(self, timeout_s: float = 10.0) -> None:
        """Wait for a pass that runs (its connection closes with it)."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _analyze(self) -> None:
        try:
            connection = self._connect()
        except Exception as error:  # never the store's failure: autovacuum still comes
            log.debug("table statistics not refreshed: cannot connect (%s)", error)
            return
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute(_GROWN_TABLES, (_STATE_TABLES,))
                tables = [name for (name,) in cursor.fetchall()]
                for table in tables:
                    cursor.execute(f'ANALYZE "{table}"')
            log.debug("analyzed %d grown tables", len(tables))
        except Exception as error:
            log.debug("table statistics not refreshed (%s)", error)
        finally:
            connection.close()

    def _connect(self) -> Any:
        import psycopg2  # the driver of a database this applies to (`applies_to`)

        params = dict(self._db.connect_params)
        return psycopg2.connect(database=self._db.database, **params)
