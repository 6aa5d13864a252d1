"""The database connections a process holds, by what they are for (`host status`).

peewee opens one connection per thread that touches the store: the host's own (its
event loop's thread, which every transaction of the host uses), and one for each thread
of a plugin's that reads the state view, kept while that thread lives. This counts
them: a connection is counted from its opening until it is closed or its thread ends
(peewee's connection state is the thread's, and goes with it).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import peewee

HOST = "host"
STATE_VIEW = "stateView"


class _Purpose(threading.local):
    name = HOST


_purpose = _Purpose()
_installed: weakref.WeakKeyDictionary[peewee.Database, ConnectionUse] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def connecting_for(purpose: str) -> Iterator[None]:
    """Connections this thread opens inside the block are counted under `purpose`."""
    before, _purpose.name = _purpose.name, purpose
    try:
        yield
    finally:
        _purpose.name = before


class ConnectionUse:
    """Installed once on a database, right after opening."""

    def __init__(self, db: peewee.Database) -> None:
        self._lock = threading.Lock()
        # id of the driver's connection -> (purpose, the thread that opened it)
        self._open: dict[int, tuple[str, weakref.ref[threading.Thread]]] = {}
        self._connect: Callable[[], Any] = db._connect  # type: ignore[attr-defined]
        self._close: Callable[[Any], Any] = db._close  # type: ignore[attr-defined]
        db._connect = self._counted_connect  # type: ignore[attr-defined]
        db._close = self._counted_close  # type: ignore[attr-defined]
        if not db.is_closed():  # opened before this was installed: this thread's
            self._note(db._state.conn)  # type: ignore[attr-defined]
        _installed[db] = self

    @staticmethod
    def on(db: peewee.Database | None) -> ConnectionUse | None:
        """The instance installed on `db`, if any."""
        return None if db is None else _installed.get(db)

    def counts(self) -> dict[str, int]:
        """Open connections by purpose (purposes with none left out)."""
        with self._lock:
            for key, (_, thread) in list(self._open.items()):
                opener = thread()
                if opener is None or not opener.is_alive():
                    del self._open[key]
            return dict(Counter(purpose for purpose, _ in self._open.values()))

    def _counted_connect(self) -> Any:
        connection = self._connect()
        self._note(connection)
        return connection

    def _note(self, connection: Any) -> None:
        with self._lock:
            self._open[id(connection)] = (_purpose.name, weakref.ref(threading.current_thread()))

    def _counted_close(self, connection: Any) -> Any:
        with self._lock:
            self._open.pop(id(connection), None)
        return self._close(connection)
