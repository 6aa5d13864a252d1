"""An in-process run store over a real state database (tests and embedding).

Each call is one transaction on the ``run_state`` functions, checked against the
revision this store last saw, so a concurrent writer shows up as
:class:`~pi_workflows.errors.RevisionConflictError` just as it would through the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..storage import StateStore, run_state
from ..storage.runs import get_run


class LocalRunBackend:
    """:class:`~pi_workflows.engine.run_backend.RunBackend` for one run of an open state store."""

    def __init__(self, state_store: StateStore, run_id: str) -> None:
        self.state_store = state_store
        self._run_id = run_id
        self._connect()
        self.revision = get_run(run_id).revision

    @property
    def run_id(self) -> str:
        return self._run_id

    def _connect(self) -> None:
        # peewee connections are per thread; the engine may run on any thread.
        self.state_store.db.connect(reuse_if_open=True)

    def _change(self, function: Callable[..., Any], payload: dict[str, Any]) -> dict[str, Any]:
        self._connect()
        with self.state_store.transaction():
            result = function(self._run_id, payload, expected_revision=self.revision)
        self.revision = result["revision"]
        return result

    def read_run_state(self, run_id: str | None = None) -> dict[str, Any]:
        self._connect()
        with self.state_store.transaction():
            return run_state.read_run_state(run_id or self._run_id)

    def write_snapshot(self, snapshot: dict[str, Any], trace_event: dict[str, Any]) -> int:
        self._connect()
        with self.state_store.transaction():
            self.revision = run_state.write_snapshot(
                self._run_id, snapshot, trace_event, expected_revision=self.revision
            )
        return self.revision

    def flush(self) -> None:
        """Nothing is held back: every call above is its own transaction."""

    def publish_update(self, update: dict[str, Any]) -> dict[str, Any]:
        return self._change(run_state.publish_update, update)

    def reserve_effect(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._change(run_state.reserve_effect, request)

    def settle_effect(self, settlement: dict[str, Any]) -> dict[str, Any]:
        return self._change(run_state.settle_effect, settlement)

    def create_human_decision_request(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._change(run_state.create_human_decision_request, request)

    def request_interaction(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._change(run_state.request_interaction, request)

    def accept_interaction(self, acceptance: dict[str, Any]) -> dict[str, Any]:
        return self._change(run_state.accept_interaction, acceptance)

    def reject_interaction(self, rejection: dict[str, Any]) -> dict[str, Any]:
        return self._change(run_state.reject_interaction, rejection)

    def request_notification(self, notification: dict[str, Any]) -> dict[str, Any]:
        return self._change(run_state.request_notification, notification)

    def request_presentation(self, presentation: dict[str, Any]) -> dict[str, Any]:
        return self._change(run_state.request_presentation, presentation)

    # In process there is no host to outlive: the engine stops its own groups when an
    # attempt ends, so registration has nothing to record.
    def register_process(self, group: dict[str, Any]) -> dict[str, Any]:
        return {}

    def unregister_process(self, group: dict[str, Any]) -> dict[str, Any]:
        return {}

    def record_transcript(self, transcript: dict[str, Any]) -> dict[str, Any]:
        return self._change(run_state.record_transcript, transcript)
