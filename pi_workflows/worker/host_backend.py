"""The engine's run backend, forwarded to the host over the worker protocol."""

from __future__ import annotations

import json
from typing import Any

from ..canonical import canonical_json
from ..event_types import NODE_ENDS, RUN_ENDS, EventType
from ..protocol.worker_messages import WorkerKind, WorkerOperation, message_kind
from .host_pipe import HostPipe

# Snapshots the engine always follows with another write before any node code runs:
# they wait for that write and go with it as one `store.batch` (one host transaction).
DEFERRED_SNAPSHOTS = frozenset({EventType.RUN_STARTED, EventType.RUN_RELAUNCHED, *NODE_ENDS})
# Snapshots after which the engine writes nothing more: they wait for the worker's
# goodbye and go with it as one message (`finish`).
FINAL_SNAPSHOTS = frozenset(RUN_ENDS.values())
# The kind of a snapshot's message, by its event (the reference's derivation); any other
# snapshot's is worker.progress.
SNAPSHOT_KINDS = {
    EventType.NODE_STARTED: WorkerKind.NODE_STARTED,
    EventType.NODE_FINISHED: WorkerKind.NODE_FINISHED,
    EventType.NODE_FAILED: WorkerKind.NODE_FAILED,
    EventType.RUN_WAITING: WorkerKind.RUN_PARKED,
    EventType.RUN_COMPLETED: WorkerKind.RUN_FINISHED,
    EventType.RUN_FAILED: WorkerKind.RUN_FINISHED,
    EventType.RUN_TIMED_OUT: WorkerKind.RUN_FINISHED,
    EventType.RUN_CANCELLED: WorkerKind.RUN_FINISHED,
}


class HostRunBackend:
    """Implements `pi_workflows.engine.run_backend.RunBackend` over the worker protocol.

    One message per call, except that a deferred snapshot (``DEFERRED_SNAPSHOTS``) is
    sent together with the next write.
    """

    def __init__(
        self, pipe: HostPipe, first_reads: dict[str | None, dict[str, Any]] | None = None
    ) -> None:
        self.pipe = pipe
        self.pending: list[dict[str, Any]] = []
        # The run (key None) and a continuation's parent as worker.ready answered them:
        # the engine's first read of each costs no message.
        self._first_reads = dict(first_reads or {})

    @property
    def run_id(self) -> str:
        return self.pipe.envelope["runId"]

    def read_run_state(self, run_id: str | None = None) -> dict[str, Any]:
        if run_id in self._first_reads and not self.pending:
            return self._first_reads.pop(run_id)
        self.flush()
        payload = {"run_id": run_id} if run_id else {}
        return self.pipe.call(WorkerOperation.READ_RUN_STATE, payload)

    def write_snapshot(self, snapshot: dict[str, Any], trace_event: dict[str, Any]) -> int:
        event_type = EventType(trace_event["type"])
        kind = SNAPSHOT_KINDS.get(event_type, WorkerKind.PROGRESS)
        payload = {"snapshot": snapshot, "trace_event": trace_event}
        if event_type in DEFERRED_SNAPSHOTS or event_type in FINAL_SNAPSHOTS:
            # The engine goes on changing its state in place: keep this one as it is now,
            # as the JSON it is sent as (a round trip through the C codec costs about
            # two thirds of a `copy.deepcopy`: 0.4 against 0.6 ms of a 3-node run).
            step = {
                "operation": WorkerOperation.WRITE_SNAPSHOT,
                "payload": json.loads(canonical_json(payload)),
                "kind": kind,
            }
            self.pending.append(step)
            return self.pipe.revision + len(self.pending)
        self._write(
            WorkerOperation.WRITE_SNAPSHOT,
            payload,
            kind=kind,
            attempt_id=trace_event.get("attemptId"),
        )
        return self.pipe.revision

    def flush(self) -> None:
        """Send the deferred snapshots now (before slow user code, and before exiting)."""
        if self.pending:
            steps, self.pending = self.pending, []
            self.pipe.call(WorkerOperation.BATCH, {"steps": steps}, kind=steps[-1]["kind"])

    def finish(self, status: str) -> None:
        """Say goodbye (worker.exiting with `status`): with the writes still held back,
        as one `store.batch`, else alone."""
        if not self.pending:
            self.pipe.call(WorkerOperation.EXITING, {"status": status}, control=True)
            return
        steps, self.pending = self.pending, []
        self.pipe.call(
            WorkerOperation.BATCH,
            {"steps": steps, "exiting": {"status": status}},
            kind=steps[-1]["kind"],
        )

    def _write(
        self,
        operation: WorkerOperation,
        payload: dict[str, Any],
        *,
        kind: WorkerKind | None = None,
        attempt_id: str | None = None,
    ) -> Any:
        if not self.pending:
            return self.pipe.call(operation, payload, kind=kind, attempt_id=attempt_id)
        kind = kind or message_kind(operation)
        steps, self.pending = self.pending, []
        steps.append({"operation": operation, "payload": payload, "kind": kind})
        result = self.pipe.call(
            WorkerOperation.BATCH, {"steps": steps}, kind=kind, attempt_id=attempt_id
        )
        return result["results"][-1]

    def publish_update(self, update: dict[str, Any]) -> dict[str, Any]:
        return self._write(WorkerOperation.PUBLISH_UPDATE, {"update": update})

    def reserve_effect(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._write(WorkerOperation.RESERVE_EFFECT, {"request": request})

    def settle_effect(self, settlement: dict[str, Any]) -> dict[str, Any]:
        return self._write(WorkerOperation.SETTLE_EFFECT, {"settlement": settlement})

    def create_human_decision_request(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._write(WorkerOperation.CREATE_HUMAN_DECISION_REQUEST, {"request": request})

    def request_interaction(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._write(WorkerOperation.REQUEST_INTERACTION, {"request": request})

    def accept_interaction(self, acceptance: dict[str, Any]) -> dict[str, Any]:
        return self._write(
            WorkerOperation.ACCEPT_INTERACTION,
            {"acceptance": acceptance},
            attempt_id=acceptance["attemptId"],
        )

    def reject_interaction(self, rejection: dict[str, Any]) -> dict[str, Any]:
        return self._write(
            WorkerOperation.REJECT_INTERACTION,
            {"rejection": rejection},
            attempt_id=rejection["attemptId"],
        )

    def request_notification(self, notification: dict[str, Any]) -> dict[str, Any]:
        return self._write(WorkerOperation.REQUEST_NOTIFICATION, {"notification": notification})

    def request_presentation(self, presentation: dict[str, Any]) -> dict[str, Any]:
        return self._write(WorkerOperation.REQUEST_PRESENTATION, {"presentation": presentation})

    def register_process(self, group: dict[str, Any]) -> dict[str, Any]:
        self.flush()
        # Known to the fence from now on: the group waits at its gate until this returns.
        self.pipe.fence.add_group(group["processGroup"])
        try:
            return self.pipe.call(WorkerOperation.REGISTER_PROCESS, group, control=True)
        except BaseException:
            self.pipe.fence.discard_group(group["processGroup"])  # it never runs
            raise

    def unregister_process(self, group: dict[str, Any]) -> dict[str, Any]:
        self.flush()
        self.pipe.fence.discard_group(group["processGroup"])
        return self.pipe.call(WorkerOperation.UNREGISTER_PROCESS, group, control=True)

    def record_transcript(self, transcript: dict[str, Any]) -> dict[str, Any]:
        return self._write(
            WorkerOperation.RECORD_TRANSCRIPT,
            {"transcript": transcript},
            attempt_id=transcript["attemptId"],
        )
