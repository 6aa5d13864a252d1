"""PostgreSQL: statements whose result nothing reads travel with the next statement.

peewee sends every statement as a round trip of its own, and the host's event loop waits
for each. Three kinds return nothing anyone reads, and are held back here to go in front
of the transaction's next statement, in the same query text (psycopg2 sends a
statement's text as it is, and the server runs the statements in order, as it would have
run them one by one; the cursor holds the last one's result):

- the transaction's ``BEGIN``: a transaction that ran no statement sends neither
  ``BEGIN`` nor ``COMMIT``;
- a savepoint's ``SAVEPOINT`` and, once its block succeeded, its ``RELEASE``
  (`StateStore.savepoint`): a block that sent nothing sends neither;
- writes whose outcome the caller does not look at (`hold_write`: a worker's stored
  reply, a node attempt's row, an announced status), sent with the next statement or
  with ``COMMIT``. A write held with a key takes the place of the last one of its key
  while only writes (and, where no check reads what it writes, checks) were held after
  it (`waiting_write`): two bumps of one run go as one ``UPDATE``. Their failure
  surfaces there instead of at the write, so a held write never crosses a savepoint's
  edge unsent: the writes of a block go with its ``RELEASE`` (inside the block's
  failure handling, so a failure undoes that block alone), and a ``SAVEPOINT`` opened
  while writes wait is sent with them, at once. A rolled-back block drops the writes it
  held.

The server's transaction and each savepoint start before their first statement either
way, so nothing the server sees or locks changes, only how many round trips carry it.

A check may travel the same way (`hold_check`): a read whose only outcome anyone needs
is that it fails when what it checks does not hold (the host's lease, `host_leases`; a
worker's claim, `run_claims`). It fails with an error of its own kind (a SQLSTATE:
``division_by_zero`` by default), raised as the check's own error from the statement it
went with; from then on every statement of that transaction, its savepoints' ends and
its ``COMMIT`` raise that error too, so the transaction cannot commit whoever catches
the first one. A check held `in_block` fails only the savepoint block it was held in:
rolling that block back clears it (a worker's write in a group commit fails alone), and
like a held write it never crosses a savepoint's edge unsent (the host's fence, which
fails the transaction wherever it fails, may). Checks that travel together fail with
different SQLSTATEs, so that the error raised is the one of the check that failed (or
fail alike).

One read may also travel behind the ``COMMIT``, in its text (`read_with_commit`): the
server runs it once the commit is done, and its rows are those the cursor holds. It is
a read by key: the only way it fails after a commit that succeeded is the connection
lost, whose commit was in doubt anyway (the connection guard's case).

Only for psycopg2, whose queries are plain text (a driver that binds parameters on the
server refuses two statements in one query); others run every statement as peewee does.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import peewee

from .driver import sqlstate

BEGIN = "BEGIN"
ROLLBACK_TO_SAVEPOINT = "ROLLBACK TO SAVEPOINT"
# How a held check says by default that what it checks does not hold (`hold_check`).
CHECK_FAILED = "22012"  # division_by_zero

_installed: weakref.WeakKeyDictionary[peewee.Database, DeferredStatements] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class HeldCheck:
    """How a held check fails (`hold_check`): the SQLSTATE its statement fails with when
    what it checks does not hold, the error raised then, and whether that fails the
    transaction or only the savepoint block it was held in (`in_block`)."""

    failure: Callable[[], Exception]
    state: str = CHECK_FAILED
    in_block: bool = False


@dataclass(frozen=True)
class _Held:
    text: str  # with any ``%`` doubled: it is sent in front of a statement's parameters
    is_write: bool
    check: HeldCheck | None = None
    # A write a later one of the same key may replace while both wait (`hold_write`),
    # and what it wrote, for that one to build on.
    key: Hashable | None = None
    written: Any = None


@dataclass(frozen=True)
class SavepointMark:
    """Where a savepoint began: the sends so far, and its place among the held texts."""

    sends: int
    index: int
    held: bool  # its SAVEPOINT was held back, not sent


@dataclass(eq=False)
class CommitRead:
    """A read that travels behind a transaction's ``COMMIT`` (`read_with_commit`).

    `build` makes its statement from the keys the transaction asked for, when the commit
    is sent: the text (``%s`` placeholders) and its parameters. `rows` are what it read
    once the commit is done; None when it did not go (the transaction rolled back, or
    ran no statement and sent no ``COMMIT``).
    """

    build: Callable[[set[str]], tuple[str, Sequence[Any]]]
    keys: set[str] = field(default_factory=set)
    rows: list[tuple[Any, ...]] | None = None
    # Which of its store's commits this was (`StateStore.commits`), once it committed.
    commit_number: int | None = None


class _Pending(threading.local):
    # peewee keeps a connection, and its transaction, per thread: so does this.
    def __init__(self) -> None:
        self.held: list[_Held] = []
        self.sends = 0  # query texts sent in this thread, to tell whether a hold went out
        self.read: CommitRead | None = None  # behind this transaction's COMMIT
        self.failed: HeldCheck | None = None  # a check of it failed

    def take_checks(self) -> dict[str, HeldCheck]:
        """The checks among the held texts by SQLSTATE (before `take`)."""
        return {item.check.state: item.check for item in self.held if item.check is not None}

    def take(self) -> str:
        held, self.held = self.held, []
        self.sends += 1
        return "".join(f"{item.text}; " for item in held)

    @property
    def has_writes(self) -> bool:
        return any(item.is_write for item in self.held)

    @property
    def must_go_before_an_edge(self) -> bool:
        """Held writes, or checks whose failure undoes their block alone: they belong to
        the open block, so a savepoint's edge sends them. A held BEGIN or SAVEPOINT may
        wait, and so may a check that fails the whole transaction wherever it fails (the
        host's fence)."""
        return any(
            item.is_write or (item.check is not None and item.check.in_block) for item in self.held
        )


class DeferredStatements:
    """Installed once on a database, right after opening (before its connection guard)."""

    def __init__(self, db: peewee.Database) -> None:
        self.db = db
        self._pending = _Pending()
        self._execute_sql: Callable[..., Any] = db.execute_sql
        self._begin: Callable[..., None] = db.begin
        self._rollback: Callable[[], Any] = db.rollback
        db.execute_sql = self._execute_sql_after_held  # type: ignore[method-assign]
        db.begin = self._hold_begin  # type: ignore[method-assign]
        db.commit = self._commit_held  # type: ignore[method-assign]
        db.rollback = self._roll_back_held  # type: ignore[method-assign]
        self._isolation_level = getattr(db, "_isolation_level", None)
        _installed[db] = self

    @staticmethod
    def applies_to(db: peewee.Database) -> bool:
        adapter = getattr(db, "_adapter", None)  # peewee's driver adapter (not in its stubs)
        return isinstance(db, peewee.PostgresqlDatabase) and type(adapter).__name__ == (
            "Psycopg2Adapter"
        )

    @staticmethod
    def on(db: peewee.Database) -> DeferredStatements | None:
        """The instance installed on `db`, if any."""
        return _installed.get(db)

    # --- writes ------------------------------------------------------------------------

    def hold_write(
        self,
        sql: str,
        params: Sequence[Any],
        *,
        key: Hashable = None,
        written: Any = None,
        across_checks: bool = False,
    ) -> bool:
        """Hold `sql` with `params` for the next statement; False outside a transaction
        (the caller runs it at once). With a `key`, it takes the place of the write of
        that key `waiting_write` finds (the caller built it on what that one `written`,
        asking with the same `across_checks`)."""
        if not self.db.in_transaction():
            return False
        held = self._pending.held
        item = _Held(self._text(sql, params), is_write=True, key=key, written=written)
        waiting = None if key is None else self._waiting(key, across_checks)
        if waiting is None:
            held.append(item)
        else:
            held[waiting] = item
        return True

    def waiting_write(self, key: Hashable, *, across_checks: bool = False) -> Any:
        """What the last write held with `key` wrote (its `written`), while it waits
        and nothing but writes was held after it (`across_checks`: writes and checks);
        else None. No savepoint edge lies between them, so the two may go as one
        statement, in the first one's place: the caller's business that none of the
        writes between touches what they write, and, across checks, that no check reads
        what they write (moved before a check, a write cannot change what it finds; and
        what fails there fails the block or the transaction the write is in anyway)."""
        waiting = self._waiting(key, across_checks)
        return None if waiting is None else self._pending.held[waiting].written

    def _waiting(self, key: Hashable, across_checks: bool) -> int | None:
        held = self._pending.held
        for index in range(len(held) - 1, -1, -1):
            item = held[index]
            if item.key == key:
                return index
            if not (item.is_write or (across_checks and item.check is not None)):
                return None
        return None

    def _text(self, sql: str, params: Sequence[Any]) -> str:
        """`sql` with `params` in it (on the client, no round trip), to be sent in front
        of, or behind, a statement with parameters of its own: `%` doubled."""
        text: str = self.db.cursor().mogrify(sql, params).decode()
        return text.replace("%", "%%")

    # --- checks ------------------------------------------------------------------------

    def hold_check(self, sql: str, params: Sequence[Any], check: HeldCheck) -> bool:
        """Hold `sql` with `params`, a statement that fails with SQLSTATE `check.state`
        when what it checks does not hold, for the transaction's next statement; that
        statement then raises `check.failure()`, and so does the rest of the
        transaction, or with `check.in_block` the rest of the savepoint block it is held
        in (until that block rolls back). False outside a transaction, or while another
        check of the same state waits to be sent (which of them failed could not be told
        apart): the caller checks at once. One that fails alike (an equal `HeldCheck`:
        the claim checks of a group's worker writes) may wait beside it: whichever fails,
        the same error is raised."""
        if not self.db.in_transaction():
            return False
        waiting = self._pending.take_checks().get(check.state)
        if waiting is not None and waiting != check:
            return False
        self._pending.held.append(_Held(self._text(sql, params), False, check))
        return True

    def _refuse_if_failed(self) -> None:
        failed = self._pending.failed
        if failed is not None:
            raise failed.failure()

    # --- a read behind the COMMIT ---------------------------------------------------------

    def read_with_commit(
        self, build: Callable[[set[str]], tuple[str, Sequence[Any]]], key: str
    ) -> CommitRead | None:
        """Inside a transaction: `key` joins the read `build` makes behind its ``COMMIT``
        (one read per transaction: the same `build` again adds its key). None outside a
        transaction, or when another read rides already."""
        if not self.db.in_transaction():
            return None
        pending = self._pending
        read = pending.read
        if read is None:
            read = pending.read = CommitRead(build)
        elif read.build != build:
            return None
        read.keys.add(key)
        return read

    # --- savepoints (StateStore.savepoint) -----------------------------------------------

    def open_savepoint(self, name: str) -> SavepointMark:
        self._refuse_if_failed()
        pending = self._pending
        statement = f"SAVEPOINT {name}"
        if pending.must_go_before_an_edge:  # outside the block: sent now, in front of it
            self.db.execute_sql(statement)
            return SavepointMark(pending.sends, len(pending.held), held=False)
        mark = SavepointMark(pending.sends, len(pending.held), held=True)
        pending.held.append(_Held(statement, is_write=False))
        return mark

    def release_savepoint(self, name: str, mark: SavepointMark) -> None:
        """The block succeeded. Called inside its failure handling: a held write that
        fails here rolls back the block alone."""
        pending = self._pending
        statement = f"RELEASE SAVEPOINT {name}"
        if pending.must_go_before_an_edge:
            self.db.execute_sql(statement)
        elif mark.held and pending.sends == mark.sends:  # the block sent nothing
            del pending.held[mark.index :]
        else:
            pending.held.append(_Held(statement, is_write=False))

    def roll_back_savepoint(self, name: str, mark: SavepointMark) -> None:
        pending = self._pending
        if pending.failed is not None and pending.failed.in_block:
            # A check of this block failed (they never cross its edges): the block is
            # undone and the transaction goes on.
            pending.held, pending.failed = [], None
            self.db.execute_sql(f"ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}")
            return
        if pending.failed is not None:  # the server's transaction failed: nothing to undo
            pending.held = []
            return
        if mark.held and pending.sends == mark.sends:  # the server never saw the block
            del pending.held[mark.index :]
            return
        # Everything held came after the last text sent, which the block's SAVEPOINT
        # went in or before: all of it belongs to the block.
        pending.held = []
        self.db.execute_sql(f"ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}")

    # --- peewee's transaction calls ------------------------------------------------------

    def _hold_begin(self, *args: Any, **kwargs: Any) -> None:
        self._pending.failed = None
        if args or kwargs or self._isolation_level:  # a BEGIN with options goes on its own
            self._begin(*args, **kwargs)
            return
        self._pending.held = [_Held(BEGIN, is_write=False)]

    def _execute_sql_after_held(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        pending = self._pending
        checks: dict[str, HeldCheck] = {}
        if pending.held:
            if sql.startswith(ROLLBACK_TO_SAVEPOINT):  # peewee's own savepoints: undone anyway
                pending.held = []
            else:
                self._refuse_if_failed()
                checks = pending.take_checks()
                sql = pending.take() + sql
        elif self.db.in_transaction():
            self._refuse_if_failed()
        return self._sent(checks, sql, *args, **kwargs)

    def _sent(self, checks: dict[str, HeldCheck], sql: str, *args: Any, **kwargs: Any) -> Any:
        """Run `sql`; when it carries a held check that fails, raise that check's error
        (and from then on for the rest of the transaction, or of the check's block)."""
        try:
            return self._execute_sql(sql, *args, **kwargs)
        except peewee.DatabaseError as error:
            check = checks.get(sqlstate(error) or "")
            if check is None:
                raise
            self._pending.failed = check
            raise check.failure() from error

    def _commit_held(self) -> Any:
        pending = self._pending
        self._refuse_if_failed()  # never a COMMIT the server would turn into a ROLLBACK
        read, pending.read = pending.read, None
        if pending.held and pending.held[0].text == BEGIN and not pending.has_writes:
            # No statement ran: the server has no transaction to end.
            pending.held = []
            return None
        checks = pending.take_checks()  # a check held with writes alone goes with the COMMIT
        text = pending.take() + "COMMIT"
        if read is not None:
            text += "; " + self._text(*read.build(read.keys))
        cursor = self._sent(checks, text)
        if read is not None:
            read.rows = cursor.fetchall()
        return cursor

    def _roll_back_held(self) -> Any:
        pending = self._pending
        never_begun = bool(pending.held) and pending.held[0].text == BEGIN
        pending.held = []
        pending.read, pending.failed = None, None
        if never_begun:
            return None
        return self._rollback()
