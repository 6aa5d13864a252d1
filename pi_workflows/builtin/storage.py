"""Built-in `piw_open_database`: SQLite in the home, or PostgreSQL by URL."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DatabaseUrlError
from ..hookspecs import hookimpl

if TYPE_CHECKING:
    import peewee


@hookimpl(trylast=True)
def piw_open_database(url: str | None, home: Path) -> peewee.Database:
    if url is None:
        return _sqlite(home / "state.sqlite")
    if url.startswith("sqlite:///"):
        return _sqlite(Path(url[len("sqlite:///") :]))
    if url.startswith(("postgresql://", "postgres://")):
        # Imported here: workers load this plugin but never open a database.
        import peewee
        from playhouse.db_url import connect  # type: ignore[import-untyped]  # no stubs

        # A server that is down or unreachable is told within seconds, not after the
        # operating system's TCP timeout: the host's event loop waits on the connect
        # (libpq's shortest timeout is 2 s; reconnects are tried at most every 5 s).
        options = {} if "connect_timeout" in url else {"connect_timeout": 2}
        try:
            return connect(url, autoconnect=False, **options)
        except (ImportError, peewee.ImproperlyConfigured) as exc:
            raise DatabaseUrlError(
                f"Cannot open {url.split('@')[-1]!r}: {exc}; install the extra with "
                "pip install 'pi-workflows[postgres]'."
            ) from exc
    if "://" in url:
        raise DatabaseUrlError(
            f"Unsupported database URL scheme {url.split('://')[0]!r}; use a SQLite path, "
            "sqlite:///PATH or postgresql://USER@HOST/DB."
        )
    return _sqlite(Path(url).expanduser())


def _sqlite(path: Path) -> peewee.SqliteDatabase:
    import peewee

    # The core applies the pragmas SPEC §4 promises to every SQLite database it opens.
    return peewee.SqliteDatabase(str(path.resolve()), autoconnect=False, check_same_thread=False)
