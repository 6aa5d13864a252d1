"""The engine's run backend, forwarded to the host over the worker protocol."""

from __future__ import annotations

from typing import Any

from .host_pipe import HostPipe


class HostRunBackend:
    """Implements `pi_workflows.engine.run_backend.RunBackend` one protocol message per call."""

    def __init__(self, pipe: HostPipe) -> None:
        self.pipe = pipe

    @property
    def run_id(self) -> str:
        return self.pipe.envelope["runId"]

    def read_run_state(self, run_id: str | None = None) -> dict[str, Any]:
        payload = {"run_id": run_id} if run_id else {}
        return self.pipe.call("store.readRunState", payload)

    def write_snapshot(self, snapshot: dict[str, Any], trace_event: dict[str, Any]) -> int:
        self.pipe.call(
            "store.writeSnapshot",
            {"snapshot": snapshot, "trace_event": trace_event},
            kind=_snapshot_kind(trace_event.get("type", "")),
            attempt_id=trace_event.get("attemptId"),
        )
        return self.pipe.revision

    def publish_update(self, update: dict[str, Any]) -> dict[str, Any]:
        return self.pipe.call("store.publishUpdate", {"update": update})

    def reserve_effect(self, request: dict[str, Any]) -> dict[str, Any]:
        return self.pipe.call("store.reserveEffect", {"request": request})

    def settle_effect(self, settlement: dict[str, Any]) -> dict[str, Any]:
        return self.pipe.call("store.settleEffect", {"settlement": settlement})

    def create_human_decision_request(self, request: dict[str, Any]) -> dict[str, Any]:
        return self.pipe.call("store.createHumanDecisionRequest", {"request": request})

    def request_interaction(self, request: dict[str, Any]) -> dict[str, Any]:
        return self.pipe.call("interaction.request", {"request": request})

    def accept_interaction(self, acceptance: dict[str, Any]) -> dict[str, Any]:
        return self.pipe.call(
            "interaction.accept", {"acceptance": acceptance}, attempt_id=acceptance["attemptId"]
        )

    def reject_interaction(self, rejection: dict[str, Any]) -> dict[str, Any]:
        return self.pipe.call(
            "interaction.reject", {"rejection": rejection}, attempt_id=rejection["attemptId"]
        )

    def request_notification(self, notification: dict[str, Any]) -> dict[str, Any]:
        return self.pipe.call("notification.request", {"notification": notification})

    def request_presentation(self, presentation: dict[str, Any]) -> dict[str, Any]:
        return self.pipe.call("presentation.request", {"presentation": presentation})

    def register_process(self, group: dict[str, Any]) -> dict[str, Any]:
        return self.pipe.call("process.register", group, control=True)

    def unregister_process(self, group: dict[str, Any]) -> dict[str, Any]:
        return self.pipe.call("process.unregister", group, control=True)

    def record_transcript(self, transcript: dict[str, Any]) -> dict[str, Any]:
        return self.pipe.call(
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
