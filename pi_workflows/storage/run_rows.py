"""A run's own rows read whole by its id: the run, its queue row and its lease, for a
caller that decides from several of their fields (the lease's ``is_live``, say).
"""

from __future__ import annotations

from .models import Lease as Lease
from .models import Run as Run
from .models import RunQueue as RunQueue


def run_row(run_id: str) -> Run:
    """The run's row (peewee's DoesNotExist when there is none)."""
    return Run.get_by_id(run_id)


def find_run_row(run_id: str) -> Run | None:
    """The run's row, or None."""
    return Run.get_or_none(Run.run_id == run_id)


def queue_row(run_id: str) -> RunQueue:
    """The run's queue row (peewee's DoesNotExist when there is none)."""
    return RunQueue.get_by_id(run_id)


def find_queue_row(run_id: str) -> RunQueue | None:
    """The run's queue row, or None."""
    return RunQueue.get_or_none(RunQueue.run == run_id)


def lease_row(run_id: str) -> Lease:
    """The run's lease (peewee's DoesNotExist when there is none)."""
    return Lease.get_by_id(run_id)


def find_lease_row(run_id: str) -> Lease | None:
    """The run's lease, or None."""
    return Lease.get_or_none(Lease.run == run_id)
