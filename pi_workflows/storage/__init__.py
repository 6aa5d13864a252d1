"""The state store: peewee models, transactions, blobs and run revisions (SPEC §4)."""

from .blobs import put_json, put_text, read_json, read_text
from .database import SCHEMA_NAME, SCHEMA_VERSION, StateStore, open_state
from .revisions import create_run_row, record_run_change

__all__ = [
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "StateStore",
    "create_run_row",
    "open_state",
    "put_json",
    "put_text",
    "read_json",
    "read_text",
    "record_run_change",
]
