"""The state store: peewee models, transactions, blobs and run revisions (SPEC §4)."""

from .blobs import put_json, put_json_in_parts, put_text, read_json, read_text
from .database import SCHEMA_NAME, SCHEMA_VERSION, StateStore, open_state
from .events import EventRecord, event_counts, run_events, run_exists
from .maintenance import state_status
from .revisions import create_run_row, record_run_change

__all__ = [
    "EventRecord",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "StateStore",
    "create_run_row",
    "event_counts",
    "open_state",
    "put_json",
    "put_json_in_parts",
    "put_text",
    "read_json",
    "read_text",
    "record_run_change",
    "run_events",
    "run_exists",
    "state_status",
]
