"""The engine's run backend, forwarded to the host over the worker protocol."""

from __future__ import annotations

import copy
from typing import Any

from .host_pipe import KIND_FOR_OPERATION, HostPipe

# Snapshots the engine always follows with another write before any node code runs:
# they wait for that write and go with it as one `store.batch` (one host transaction).
DEFERRED_SNAPSHOTS = frozenset({"run_started", "run_resumed", "node_finished", "node_failed"})
# Snapshots after which the engine writes nothing more: they wait for the worker's
# goodbye and go with it as one message (`finish`).
FINAL_SNAPSHOTS = frozenset(
    {"run_completed", "run_waiting", "run_failed", "run_cancelled", "run_timed_out"}
)


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
        return self.pipe.call("store.readRunState", payload)

    def write_snapshot(self, snapshot: dict[str, Any], trace_event: dict[str, Any]) -> int:
        event_type = trace_event.get("type", "")
        payload = {"snapshot": snapshot, "trace_event": trace_event}
        if event_type in DEFERRED_SNAPSHOTS or event_type in FINAL_SNAPSHOTS:
            # The engine goes on changing its state in place: keep this one as it is now.
            step = {
                "operation": "store.writeSnapshot",
                "payload": copy.deepcopy(payload),
                "kind": _snapshot_kind(event_type),
            }
            self.pending.append(step)
            return self.pipe.revision + len(self.pending)
        self._write(
            "store.writeSnapshot",
            payload,
            kind=_snapshot_kind(event_type),
            attempt_id=trace_event.get("attemptId"),
        )
        return self.pipe.revision

    def flush(self) -> None:
        """Send the deferred snapshots now (before slow user code, and before exiting)."""
        if self.pending:
            steps, self.pending = self.pending, []
            self.pipe.call("store.batch", {"steps": steps}, kind=steps[-1]["kind"])

    def finish(self, status: str) -> None:
        """Say goodbye (worker.exiting with `status`): with the writes still held back,
        as one `store.batch`, else alone."""
        if not self.pending:
            self.pipe.call("worker.exiting", {"status": status}, control=True)
            return
        steps, self.pending = self.pending, []
        self.pipe.call(
            "store.batch", {"steps": steps, "exiting": {"status": status}}, kind=steps[-1]["kind"]
        )

    def _write(
        self,
        operation: str,
        payload: dict[str, Any],
        *,
        kind: str | None = None,
        attempt_id: str | None = None,
    ) -> Any:
        if not self.pending:
            return self.pipe.call(operation, payload, kind=kind, attempt_id=attempt_id)
        kind = kind or KIND_FOR_OPERATION.get(operation, "worker.progress")
        steps, self.pending = self.pending, []
        steps.append({"operation": operation, "payload": payload, "kind": kind})
        result = self.pipe.call("store.batch", {"steps": steps}, kind=kind, attempt_id=attempt_id)
        return result["results"][-1]

    def publish_update(self, update: dict[str, Any]) -> dict[str, Any]:
        return self._write("store.publishUpdate", {"update": update})

    def reserve_effect(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._write("store.reserveEffect", {"request": request})

    def settle_effect(self, settlement: dict[str, Any]) -> dict[str, Any]:
        return self._write("store.settleEffect", {"settlement": settlement})

    def create_human_decision_request(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._write("store.createHumanDecisionRequest", {"request": request})

    def request_interaction(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._write("interaction.request", {"request": request})

    def accept_interaction(self, acceptance: dict[str, Any]) -> dict[str, Any]:
        return self._write(
            "interaction.accept", {"acceptance": acceptance}, attempt_id=acceptance["attemptId"]
        )

    def reject_interaction(self, rejection: dict[str, Any]) -> dict[str, Any]:
        return self._write(
            "interaction.reject", {"rejection": rejection}, attempt_id=rejection["attemptId"]
        )

    def request_notification(self, notification: dict[str, Any]) -> dict[str, Any]:
        return self._write("notification.request", {"notification": notification})

    def request_presentation(self, presentation: dict[str, Any]) -> dict[str, Any]:
        return self._write("presentation.request", {"presentation": presentation})

    def register_process(self, group: dict[str, Any]) -> dict[str, Any]:
        self.flush()
        # Known to the fence from now on: the group waits at its gate until this returns.
        self.pipe.fence.add_group(group["processGroup"])
        try:
            return self.pipe.call("process.register", group, control=True)
        except BaseException:
            self.pipe.fence.discard_group(group["processGroup"])  # it never runs
            raise

    def unregister_process(self, group: dict[str, Any]) -> dict[str, Any]:
        self.flush()
        self.pipe.fence.discard_group(group["processGroup"])
        return self.pipe.call("process.unregister", group, control=True)

    def record_transcript(self, transcript: dict[str, Any]) -> dict[str, Any]:
        return self._write(
            "transcript.record", {"transcript": transcript}, attempt_id=transcript["attemptId"]
        )


def _snapshot_kind(event_type: str) -> str:
    if event_type == "node_started":
        return "node.started"
    if event_type == "node_finished":
        return "node.finished"
    if event_type in ("node_failed", "node_timed_out"):
        return "node.failed"
    if event_type == "run_waiting" or "park" in event_type:
        return "run.parked"
    if event_type.startswith("run_") and event_type != "run_started":
        return "run.finished"
    return "worker.progress"
