"""The query texts a state store's connection sends, for tests that count round trips."""

from __future__ import annotations

import pytest

from pi_workflows.storage import StateStore


class SentStatements:
    """The query texts a store's connection sends, one per round trip (on PostgreSQL a
    text may carry several statements: held writes travel with the next one)."""

    def __init__(self, store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.texts: list[str] = []
        opened = store.db.cursor
        monkeypatch.setattr(store.db, "cursor", lambda *args: self._recording(opened(*args)))

    def _recording(self, cursor):
        texts = self.texts

        class Recording:
            def execute(self, sql, params=None):
                texts.append(" ".join(str(sql).split()))
                # psycopg2 formats `sql` only when given parameters; sqlite3 wants a sequence.
                return cursor.execute(sql) if params is None else cursor.execute(sql, params)

            def __getattr__(self, name):
                return getattr(cursor, name)

        return Recording()

    def take(self, *, prepares: bool = False) -> list[str]:
        """The texts sent since the last take; without the `PREPARE`s sent between
        transactions (`server_plans`) unless `prepares`."""
        texts, self.texts = self.texts, []
        return [text for text in texts if prepares or not text.startswith("PREPARE ")]
