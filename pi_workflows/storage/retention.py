"""Pruning finished runs: what goes, what is protected, and the blobs nothing references.

A run goes with its whole lineage (the root and every continuation and restart, which all
share `root_run_id`), and only once every run of it has finished before the cut-off. A
lineage is protected while any of its runs is unfinished, or has a pending decision, an
unsettled effect, an undelivered terminal message or a live worker. Deletion happens in
bounded transactions of a few lineages each, so a host writing alongside waits at most one
batch; each batch locks its lineages' runs and checks them again, so a restart created
since the plan keeps its lineage (on PostgreSQL too, where other writers do not wait for
the batch: see `_prune_batch`). A dry run does the same work and rolls each batch back.

A blob (content-addressed, shared by any row that stores the same bytes) is deleted only
when no remaining row references it, directly in a `*_hash` column or nested in a blob that
is kept: the parts of a split value (`blobs.put_json_in_parts`) and an agent transcript
named by its event's payload, which `nested_blobs` lists (`NestedBlob`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import peewee

from ..event_types import EventType
from . import statements
from .database import StateStore
from .models import (
    ACTIVE_WORKER_STATUSES,
    ALL_MODELS,
    TERMINAL_RUN_STATUSES,
    Blob,
    Effect,
    Event,
    ForwardedCommand,
    HostCommand,
    HumanDecision,
    HumanDecisionResolution,
    InteractiveRequest,
    InteractiveSubmission,
    Lease,
    NestedBlob,
    NodeAttempt,
    Run,
    RunProcess,
    RunQueue,
    RunWorker,
    WorkerMessage,
    WorkflowMessage,
    WorkflowTurn,
    WorkflowUpdate,
    blob_columns,
)
from .prepared import tuple_rows

DAY_MS = 24 * 60 * 60 * 1000
#: Lineages deleted per transaction: the longest a host writing alongside has to wait.
LINEAGES_PER_BATCH = 50
#: Hashes per `IN (...)` list (SQLite allows 32766 parameters; PostgreSQL 65535).
HASHES_PER_QUERY = 500

UNSETTLED_EFFECT_STATUSES = ("pending", "applying", "ambiguous")


@dataclass
class PruneReport:
    """What a prune removed (`applied`) or would remove (a dry run)."""

    before: int
    applied: bool
    runs: int = 0
    lineages: int = 0
    events: int = 0
    transcripts: int = 0
    blobs: int = 0
    bytes: int = 0
    protected: int = 0  # lineages finished before the cut-off that something keeps
    backup: dict[str, Any] | None = field(default=None)

    def as_json(self) -> dict[str, Any]:
        report: dict[str, Any] = {
            "before": self.before,
            "applied": self.applied,
            "runs": self.runs,
            "lineages": self.lineages,
            "events": self.events,
            "transcripts": self.transcripts,
            "blobs": self.blobs,
            "bytes": self.bytes,
            "protectedLineages": self.protected,
        }
        if self.backup is not None:
            report["backup"] = self.backup
        return report


class _DryRun(Exception):
    """Raised at the end of a dry run's batch so its transaction rolls back."""


def prune(store: StateStore, before: int, *, apply: bool) -> PruneReport:
    """Delete (with `apply`; otherwise count) the lineages that finished before `before`
    (epoch ms) and nothing protects, and the blobs only they referenced."""
    report = PruneReport(before=before, applied=apply)
    for _ in prune_batches(store, report):
        pass
    return report


def prune_batches(store: StateStore, report: PruneReport) -> Iterator[None]:
    """`prune`, one transaction per step: a host resumes between them to serve others.

    First the lineages, then the blobs older than the cut-off that nothing references any
    more (a run's earlier snapshots, replaced by its later ones while it ran). Each step
    checks the references again under its locks (`_lock_unheld`), so a blob a new row
    took up since the plan stays.
    """
    roots = _finished_roots(report.before, None)
    lineages = (
        functools.partial(_prune_batch, roots[start : start + LINEAGES_PER_BATCH], report)
        for start in range(0, len(roots), LINEAGES_PER_BATCH)
    )
    # Planned a page at a time once the lineages are gone (with them, their blobs).
    orphans = (
        functools.partial(_delete_unreferenced, chunk, report)
        for chunk in _unreferenced_before(report.before)
    )
    for step in itertools.chain(lineages, orphans):
        try:
            with store.transaction():
                step()
                if not report.applied:
                    raise _DryRun
        except _DryRun:
            pass
        yield


def _settled() -> peewee.Expression:
    """A run that is done: terminal, or answered and carried on by a continuation (it
    stays `waiting` with its queue row `done`)."""
    return Run.status.in_(TERMINAL_RUN_STATUSES) | (
        (Run.status == "waiting") & (RunQueue.status == "done")
    )


def _finished_roots(before: int, roots: list[str] | None) -> list[str]:
    """Root ids of the lineages whose every run is settled, the last before `before`."""
    unsettled = peewee.Case(None, [(_settled(), 0)], 1)
    finished = peewee.fn.COALESCE(Run.finished_at, Run.updated_at)
    query = (
        Run.select(Run.root_run_id)
        .join(RunQueue, peewee.JOIN.LEFT_OUTER, on=(RunQueue.run == Run.run_id))
        .group_by(Run.root_run_id)
        .having((peewee.fn.SUM(unsettled) == 0) & (peewee.fn.MAX(finished) < before))
        .order_by(Run.root_run_id)
    )
    if roots is not None:
        query = query.where(Run.root_run_id.in_(roots))
    return [row.root_run_id for row in query]


def _protected_runs(run_ids: list[str]) -> set[str]:
    """Of `run_ids`, those something still needs (their lineage stays whole)."""
    protected: set[str] = set()
    for query in (
        HumanDecision.select(HumanDecision.run).where(
            HumanDecision.run.in_(run_ids) & (HumanDecision.status == "pending")
        ),
        Effect.select(Effect.run).where(
            Effect.run.in_(run_ids) & Effect.status.in_(UNSETTLED_EFFECT_STATUSES)
        ),
        WorkflowMessage.select(WorkflowMessage.run).where(
            WorkflowMessage.run.in_(run_ids)
            & (WorkflowMessage.kind == "terminal")
            & (WorkflowMessage.status == "pending")
        ),
        RunWorker.select(RunWorker.run).where(
            RunWorker.run.in_(run_ids) & RunWorker.status.in_(ACTIVE_WORKER_STATUSES)
        ),
    ):
        protected.update(row[0] for row in tuple_rows(query))
    return protected


def _prune_batch(batch: list[str], report: PruneReport) -> None:
    """Delete the lineages of `batch` that are still prunable (inside a transaction).

    Their runs are locked first (PostgreSQL; on SQLite the write lock is enough): a run
    derived from one of them meanwhile holds its parent's row until it commits
    (`statements.hold_run`), so this waits for it and the check below sees it; one derived
    later waits for this transaction and finds its parent gone.
    """
    _lock_lineages(batch)
    roots = _finished_roots(report.before, batch)
    runs = list(Run.select(Run.run_id, Run.root_run_id).where(Run.root_run_id.in_(roots)))
    protected = _protected_runs([r.run_id for r in runs])
    kept_roots = {r.root_run_id for r in runs if r.run_id in protected}
    report.protected += len(kept_roots) + len(set(batch) - set(roots))
    run_ids = [r.run_id for r in runs if r.root_run_id not in kept_roots]
    if not run_ids:
        return
    report.lineages += len(set(roots) - kept_roots)
    report.runs += len(run_ids)
    events = Event.select().where(Event.run.in_(run_ids))
    report.events += events.count()
    report.transcripts += events.where(
        Event.event_type == EventType.AGENT_TRANSCRIPT_RECORDED
    ).count()
    candidates = _with_nested(_hashes_of_rows(run_ids))
    _delete_rows(run_ids)
    _delete_unreferenced(candidates, report)


def _lock_lineages(roots: list[str]) -> None:
    if Run._meta.database.for_update:
        query = Run.select(Run.run_id).where(Run.root_run_id.in_(roots)).order_by(Run.run_id)
        list(tuple_rows(query.for_update()))  # in run id order: two prunes cannot deadlock


def _delete_unreferenced(candidates: set[str], report: PruneReport) -> None:
    """Delete the blobs of `candidates` that no remaining row references."""
    locked = _lock_unheld(candidates)
    doomed = locked - _still_referenced(locked)
    for chunk in _chunks(sorted(doomed)):
        report.blobs += len(chunk)
        size = Blob.select(peewee.fn.SUM(Blob.byte_length)).where(Blob.blob_hash.in_(chunk))
        report.bytes += int(size.scalar() or 0)
        Blob.delete().where(Blob.blob_hash.in_(chunk)).execute()
        NestedBlob.delete().where(NestedBlob.holder_hash.in_(chunk)).execute()


def _lock_unheld(candidates: set[str]) -> set[str]:
    """Lock the rows of `candidates` that no writer holds, for deletion; returns them.

    A writer that takes up a stored blob holds its row until it commits (`blobs._reuse`,
    the row lock a foreign key would take, which nested references could not have). So
    after this lock, the reference check sees every writer that took one of these up and
    committed; a writer that has not committed yet holds its blob, which is skipped (and
    left to a later prune if that writer rolls back), and a writer that comes later waits
    for this transaction and stores the blob again if it was deleted. Skipping rather than
    waiting keeps a prune step from queueing behind a writer's transaction. On SQLite the
    transaction's write lock shuts every other writer out already.
    """
    found: set[str] = set()
    for chunk in _chunks(sorted(candidates)):
        query = Blob.select(Blob.blob_hash).where(Blob.blob_hash.in_(chunk))
        if Blob._meta.database.for_update:
            # peewee takes the clause text; its stubs say a bool
            query = query.for_update("FOR UPDATE SKIP LOCKED")  # type: ignore[arg-type]
        found.update(row[0] for row in tuple_rows(query))
    return found


# Rows that belong to a run, children before their parents; the second item selects the
# rows of the runs in `run_ids`.
def _run_rows(run_ids: list[str]) -> list[tuple[type[peewee.Model], peewee.Expression]]:
    workers = RunWorker.select(RunWorker.worker_epoch).where(RunWorker.run.in_(run_ids))
    requests = InteractiveRequest.select(InteractiveRequest.request_id).where(
        InteractiveRequest.run.in_(run_ids)
    )
    decisions = HumanDecision.select(HumanDecision.decision_id).where(
        HumanDecision.run.in_(run_ids)
    )
    return [
        (WorkerMessage, WorkerMessage.worker.in_(workers)),
        (InteractiveSubmission, InteractiveSubmission.request.in_(requests)),
        (HumanDecisionResolution, HumanDecisionResolution.decision.in_(decisions)),
        (RunProcess, RunProcess.run.in_(run_ids)),
        (WorkflowTurn, WorkflowTurn.run.in_(run_ids)),
        (WorkflowMessage, WorkflowMessage.run.in_(run_ids)),
        (RunWorker, RunWorker.run.in_(run_ids)),
        (NodeAttempt, NodeAttempt.run.in_(run_ids)),
        (WorkflowUpdate, WorkflowUpdate.run.in_(run_ids)),
        (InteractiveRequest, InteractiveRequest.run.in_(run_ids)),
        (HumanDecision, HumanDecision.run.in_(run_ids)),
        (Effect, Effect.run.in_(run_ids)),
        (ForwardedCommand, ForwardedCommand.run.in_(run_ids)),
        (Event, Event.run.in_(run_ids)),
        (Lease, Lease.run.in_(run_ids)),
        (RunQueue, RunQueue.run.in_(run_ids)),
        (HostCommand, HostCommand.run_id.in_(run_ids)),
        (Run, Run.run_id.in_(run_ids)),
    ]


# Every table with a blob column: rows that are not a run's (channel effects, run-less
# commands) reference blobs too.
_REFERENCING = [model for model in ALL_MODELS if model is not Blob and blob_columns(model)]


def _hashes_of_rows(run_ids: list[str]) -> set[str]:
    hashes: set[str] = set()
    for model, where in _run_rows(run_ids):
        columns = blob_columns(model)
        if columns:
            for row in tuple_rows(model.select(*columns).where(where)):
                hashes.update(value for value in row if value)
    return hashes


def _delete_rows(run_ids: list[str]) -> None:
    # Explicitly, children first: the same on both backends whatever the cascade settings.
    for model, where in _run_rows(run_ids):
        model.delete().where(where).execute()


def _with_nested(hashes: set[str]) -> set[str]:
    """`hashes` and every blob nested in one of them, however deep."""
    found, holders = set(hashes), set(hashes)
    while holders:
        nested: set[str] = set()
        for chunk in _chunks(sorted(holders)):
            query = NestedBlob.select(NestedBlob.blob_hash).where(NestedBlob.holder_hash.in_(chunk))
            nested.update(row[0] for row in tuple_rows(query))
        holders = nested - found
        found |= holders
    return found


def _still_referenced(candidates: set[str]) -> set[str]:
    """Of `candidates`, those a remaining row references directly or through a value it
    references (after the pruned rows were deleted).

    A candidate nested in a blob that is not a candidate is kept: that blob is not being
    deleted (or a writer holds it). One nested only in candidates is kept when one of
    them is.
    """
    referenced = _directly_referenced(candidates)
    holders = _holders(candidates - referenced)
    while True:
        grown = referenced | {
            blob_hash
            for blob_hash, its_holders in holders.items()
            if any(holder in referenced or holder not in candidates for holder in its_holders)
        }
        if grown == referenced:
            return referenced
        referenced = grown


def _holders(hashes: set[str]) -> dict[str, set[str]]:
    """The blobs each of `hashes` is nested in (those nested in none are left out)."""
    holders: dict[str, set[str]] = {}
    for chunk in _chunks(sorted(hashes)):
        query = NestedBlob.select(NestedBlob.blob_hash, NestedBlob.holder_hash).where(
            NestedBlob.blob_hash.in_(chunk)
        )
        for blob_hash, holder_hash in tuple_rows(query):
            holders.setdefault(blob_hash, set()).add(holder_hash)
    return holders


def _directly_referenced(candidates: set[str]) -> set[str]:
    """Of `candidates`, those a row names in a blob column (each column's index answers)."""
    referenced: set[str] = set()
    for chunk in _chunks(sorted(candidates)):
        for sql in _references_sql(len(chunk)):
            referenced.update(row[0] for row in statements.rows(sql, chunk))
    return referenced


@functools.lru_cache(maxsize=4)
def _references_sql(count: int) -> tuple[str, ...]:
    """For each blob column, the statement that selects which of `count` hashes it names:
    written once per chunk length (built by peewee for every chunk, they cost several
    times what running them does)."""
    marks = ", ".join(["?"] * count)
    return tuple(
        f"SELECT DISTINCT {column.column_name} FROM {model._meta.table_name} "
        f"WHERE {column.column_name} IN ({marks})"
        for model in _REFERENCING
        for column in blob_columns(model)
    )


def _unreferenced_before(before: int) -> Iterator[set[str]]:
    """Blobs stored before `before` that no row references directly, a page at a time in
    the order of their age index (read without a lock: `_delete_unreferenced` checks each
    page again). The pages go on from the last blob read, so deleting them between pages
    skips nothing."""
    after: tuple[int, str] = (-1, "")
    while True:
        page = (
            Blob.select(Blob.created_at, Blob.blob_hash)
            .where(
                (Blob.created_at < before) & (peewee.Tuple(Blob.created_at, Blob.blob_hash) > after)
            )
            .order_by(Blob.created_at, Blob.blob_hash)
            .limit(HASHES_PER_QUERY)
        )
        rows = list(tuple_rows(page))
        if not rows:
            return
        after = rows[-1]
        hashes = {blob_hash for _, blob_hash in rows}
        unreferenced = hashes - _directly_referenced(hashes)
        if unreferenced:
            yield unreferenced


def _chunks(values: list[str]) -> list[list[str]]:
    return [values[i : i + HASHES_PER_QUERY] for i in range(0, len(values), HASHES_PER_QUERY)]
