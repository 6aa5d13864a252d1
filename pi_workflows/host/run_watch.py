"""Following runs live: `view.run.watch` and `view.runs.watch` (SPEC §8, §13).

A run watch pushes `run_progress` events: the run's new progress entries (node attempts,
published updates, run transitions; `storage.run_progress`), its compact status and
what holds it now (`run.why`), with `settled: true` once the run is terminal, waiting,
or held until someone acts. With `statusOnly: true` it pushes `run_status` events
instead: the whole `run.status` object each time it changes, and nothing else (what
`WorkflowClient.wait_for_run` waits on: one query per publish instead of a run.why).
A runs watch pushes `runs_changed` with the status of every run (newest 100) whose
revision moved (without its output and error). Both are published after worker writes,
when a run stops, and on the poll timer; `view.unwatch` ends either kind. After worker
writes only the watches of the runs written are read again: with many waiting clients a
write no longer costs one status read per watch of every run. On PostgreSQL the status
of a run a status watch follows is read behind the write's ``COMMIT``, in its round
trip (`StateStore.read_with_commit`), and published as read unless another commit came
after it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidInputError
from ..protocol.client_messages import SCHEMA, ClientRequest, response
from ..protocol.framing import valid_id
from ..protocol.worker_messages import WorkerOperation
from ..storage.deferred_statements import CommitRead
from ..storage.run_progress import progress_after
from ..storage.run_statuses import is_terminal_status
from ..storage.runs import get_run, run_status, run_statuses, statuses_from, statuses_read
from .features import feature_hook
from .operations import OperationTable
from .run_why import OPERATOR_HOLDS, explain, host_view
from .services import HostServices

log = logging.getLogger(__name__)

RUNS_WATCH_LIMIT = 100
STATUS_FIELDS = ("runId", "workflowName", "status", "queueStatus", "paused", "errorCode")
# What a runs list shows of each run: no output or error, which may be large.
RUNS_CHANGED_FIELDS = (
    *STATUS_FIELDS,
    "statusDetail",
    "continuation",
    "revision",
    "createdAt",
    "updatedAt",
)


@dataclass
class RunWatch:
    connection: Any
    subscription_id: str
    run_id: str | None  # None: every run (view.runs.watch)
    revision: int = 0
    last_sent: Any = None
    revisions: dict[str, int] = field(default_factory=dict)
    status_only: bool = False
    # A status watch's run status as its request read it, and the host's commit count
    # then: its first push while no commit came after (`_publish_status`).
    first: tuple[dict[str, Any], int] | None = None


class RunWatches:
    """The run and runs views, a host feature."""

    def __init__(self, services: HostServices) -> None:
        self.services = services
        self.watches: dict[tuple[str, str], RunWatch] = {}
        # Connections told to detach their watches when they close: once each, however
        # many watches come and go on one (a client's kept watch connection).
        self._attached: set[str] = set()
        self._scheduled = False
        # The runs written since the last publish; None: every watch is read again.
        self._changed: set[str] | None = set()
        # Statuses read behind the commits of those writes (PostgreSQL), and those of
        # them that still stand: read behind commit number `_fresh_at`, the last one.
        self._reads: list[CommitRead] = []
        self._fresh: dict[str, dict[str, Any]] = {}
        self._fresh_at = 0

    @feature_hook
    def piwh_register_operations(self, operations: OperationTable) -> None:
        operations.register_live("view.run.watch", self.watch_run)
        operations.register_live("view.runs.watch", self.watch_runs)
        # view.unwatch belongs to the sessions feature; it ends run watches too.
        operations.wrap_live("view.unwatch", self.unwatch)

    @feature_hook
    def piwh_worker_operation(
        self, operation: WorkerOperation, run_id: str, payload: dict[str, Any], result: Any
    ) -> None:
        if operation in (WorkerOperation.WRITE_SNAPSHOT, WorkerOperation.PUBLISH_UPDATE):
            store = self.services.store
            if any(w.status_only and w.run_id == run_id for w in self.watches.values()):
                read = store.read_with_commit(statuses_read, run_id)
                if read is not None and read not in self._reads:
                    self._reads.append(read)
            store.after_commit(lambda: self.publish_soon(run_id))

    @feature_hook
    def piwh_run_stopped(self, run_id: str, old_status: str | None, new_status: str) -> None:
        self.publish_soon()

    @feature_hook
    def piwh_poll(self) -> None:
        self.publish_soon()  # what changed outside worker writes (a pause, say) shows here

    # --- operations --------------------------------------------------------------------

    async def watch_run(self, request: ClientRequest, connection: Any) -> dict[str, Any]:
        payload = request.payload
        run_id = request.run_id or payload.get("runId")
        if not valid_id(run_id):
            raise InvalidInputError("view.run.watch needs a runId.")
        after = payload.get("afterRevision", 0)
        if type(after) is not int or after < 0:
            raise InvalidInputError("afterRevision must be a non-negative integer.")
        status_only = payload.get("statusOnly", False)
        if type(status_only) is not bool:
            raise InvalidInputError("statusOnly must be true or false.")
        watch = RunWatch(connection, "", run_id, revision=after, status_only=status_only)
        if status_only:  # one read refuses an unknown run and is the first push
            watch.first = (run_status(run_id), self.services.store.commits)
        else:
            get_run(run_id)  # notFound for an unknown run
        self._add(request, connection, watch)
        return response(request.request_id, "accepted", receipt={"subscribed": True})

    async def watch_runs(self, request: ClientRequest, connection: Any) -> dict[str, Any]:
        self._add(request, connection, RunWatch(connection, "", None))
        return response(request.request_id, "accepted", receipt={"subscribed": True})

    def _add(self, request: ClientRequest, connection: Any, watch: RunWatch) -> None:
        if connection is None:
            raise InvalidInputError(f"{request.operation} requires a live client connection")
        subscription_id = request.payload.get("subscriptionId")
        if not valid_id(subscription_id):
            raise InvalidInputError("subscriptionId must be text")
        watch.subscription_id = subscription_id
        key = (connection.connection_id, subscription_id)
        if connection.connection_id not in self._attached:
            self._attached.add(connection.connection_id)
            connection.on_close(lambda: self._detach(connection.connection_id))
        self.watches[key] = watch
        self.publish_soon(watch.run_id)  # the new watch's first push

    async def unwatch(
        self, request: ClientRequest, connection: Any, proceed: Any
    ) -> dict[str, Any]:
        subscription_id = request.payload.get("subscriptionId")
        if connection is not None and valid_id(subscription_id):
            self.watches.pop((connection.connection_id, subscription_id), None)
        return await proceed(request, connection)

    def _detach(self, connection_id: str) -> None:
        self._attached.discard(connection_id)
        for key in [key for key in self.watches if key[0] == connection_id]:
            del self.watches[key]

    # --- publishing --------------------------------------------------------------------

    def publish_soon(self, run_id: str | None = None) -> None:
        """Publish at the next loop pass: the watches of `run_id`, else every watch."""
        if not self.watches or self.services.is_stopping:
            return
        if run_id is None:
            self._changed = None
        elif self._changed is not None:
            self._changed.add(run_id)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.publish)

    def publish(self) -> None:
        self._scheduled = False
        changed, self._changed = self._changed, set()
        fresh = self._fresh_statuses()
        for watch in list(self.watches.values()):
            if not watch.connection.is_open:
                continue
            if changed is not None and watch.run_id is not None and watch.run_id not in changed:
                continue  # its run was not written: nothing of it moved
            try:
                if watch.run_id is None:
                    self._publish_runs(watch)
                elif watch.status_only:
                    self._publish_status(watch, fresh.get(watch.run_id))
                else:
                    self._publish_run(watch)
            except Exception:  # one broken view must not stop the others
                log.exception("publishing a run watch failed")

    def _publish_run(self, watch: RunWatch) -> None:
        assert watch.run_id is not None
        entries: list[dict[str, Any]] = []
        while True:
            batch, revision = progress_after(watch.run_id, watch.revision)
            entries += batch
            if revision == watch.revision:
                break
            watch.revision = revision
        status = {
            key: value for key, value in run_status(watch.run_id).items() if key in STATUS_FIELDS
        }
        why = explain(watch.run_id, host_view(self.services))
        settled = (
            is_terminal_status(status["status"])
            or status["status"] == "waiting"
            or why["code"] in OPERATOR_HOLDS
        )
        summary = (status, why["code"], why["reason"])
        if not entries and summary == watch.last_sent:
            return
        watch.last_sent = summary
        self._push(
            watch,
            "run_progress",
            {
                "runId": watch.run_id,
                "revision": watch.revision,
                "entries": entries,
                "status": status,
                "why": why,
                "settled": settled,
            },
        )

    def _fresh_statuses(self) -> dict[str, dict[str, Any]]:
        """The statuses read behind the last commit, while no commit came after it (kept
        for every publish until then: a run's stop publishes again)."""
        commits = self.services.store.commits
        if self._fresh_at != commits:
            self._fresh, self._fresh_at = {}, commits
        reads, self._reads = self._reads, []
        for read in reads:  # outside a transaction: each committed, or rolled back
            if read.rows and read.commit_number == commits:
                self._fresh.update(statuses_from(read.rows))
        return self._fresh

    def _publish_status(self, watch: RunWatch, fresh: dict[str, Any] | None = None) -> None:
        assert watch.run_id is not None
        first, watch.first = watch.first, None
        if fresh is None and first is not None and first[1] == self.services.store.commits:
            fresh = first[0]
        status = fresh if fresh is not None else run_status(watch.run_id)
        if status != watch.last_sent:
            watch.last_sent = status
            watch.revision = status["revision"]
            self._push(watch, "run_status", status)

    def _publish_runs(self, watch: RunWatch) -> None:
        changed = []
        for status in run_statuses(RUNS_WATCH_LIMIT):
            if watch.revisions.get(status["runId"]) != status["revision"]:
                watch.revisions[status["runId"]] = status["revision"]
                changed.append({key: status[key] for key in RUNS_CHANGED_FIELDS})
        if changed:
            self._push(watch, "runs_changed", {"runs": changed})

    def _push(self, watch: RunWatch, event: str, payload: dict[str, Any]) -> None:
        message: dict[str, Any] = {
            "schema": SCHEMA,
            "type": "event",
            "subscriptionId": watch.subscription_id,
            "event": event,
            "payload": payload,
        }
        if watch.run_id is not None:
            message.update(runId=watch.run_id, revision=watch.revision)
        # A status is whole (an unsent one is obsolete); progress and changes add up.
        replaces = watch.subscription_id if event == "run_status" else None
        watch.connection.push(message, replaces=replaces)
