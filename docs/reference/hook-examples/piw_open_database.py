# A storage plugin: `shared:NAME` URLs keep the state in the SQLite file NAME.sqlite of the
# directory $PIW_SHARED_DIR. Set both wherever pi-workflows runs (CLI and host).
import os
from pathlib import Path

import peewee

from pi_workflows.plugin import PiWorkflowsError, hookimpl


class SharedUrlError(PiWorkflowsError):
    """A shared: URL that cannot be opened (the CLI prints this sentence on one line)."""


@hookimpl
def piw_open_database(url, home):
    if not url or not url.startswith("shared:"):
        return None  # every other URL: the built-in decides
    directory = os.environ.get("PIW_SHARED_DIR")
    if not directory:
        raise SharedUrlError("shared: URLs need PIW_SHARED_DIR set to a directory.")
    # A plain SqliteDatabase: the core creates the file 0600 and sets WAL, foreign keys, ...
    return peewee.SqliteDatabase(str(Path(directory) / f"{url.removeprefix('shared:')}.sqlite"))
