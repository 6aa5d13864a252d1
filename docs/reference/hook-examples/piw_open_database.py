# A storage plugin: `memory://` URLs open a private in-memory SQLite database (for demos).
import peewee

from pi_workflows import hookimpl


@hookimpl
def piw_open_database(url, home):
    if url and url.startswith("memory://"):
        return peewee.SqliteDatabase(":memory:")
    return None  # every other URL: the built-in decides
