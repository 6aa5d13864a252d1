"""A reference session client: what a chat UI does to be a workflow session (SPEC §9).

It holds one connection as the session's coordinator, follows the session view the
host pushes, shows ("sends") workflow messages, reports its model turns and submits
step outputs. The protocol is documented in docs/sessions.md; this class is the
executable version of that document, built only on `pi_workflows.client`.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import HostProtocolError, HostUnavailableError, PiWorkflowsError
from ..home import Home
from .autostart import connect
from .connection import HostConnection, RequestFailed, Response

TURN_KINDS = ("step", "terminal", "followUp")


class SessionConnection(HostConnection):
    """A host connection that keeps pushed events instead of skipping them.

    A reader thread moves every incoming message into a queue, so waiting for an event
    with a deadline never leaves the socket half-read.
    """

    def __init__(self, socket_path: Any, timeout_s: float = 30.0) -> None:
        self.events: collections.deque[dict[str, Any]] = collections.deque()
        self.timeout_s = timeout_s
        self._inbox: queue.Queue[dict[str, Any] | Exception] | None = None
        super().__init__(socket_path, timeout_s)
        self._sock.settimeout(None)
        self._inbox = queue.Queue()
        threading.Thread(target=self._pump, name="piw-session-reader", daemon=True).start()

    def _pump(self) -> None:
        assert self._inbox is not None
        while True:
            try:
                message = HostConnection._read_message(self)
            except Exception as error:  # closed or broken: every waiter learns it
                self._inbox.put(error)
                return
            self._inbox.put(message)

    def _next(self, timeout_s: float) -> dict[str, Any] | None:
        assert self._inbox is not None
        try:
            item = self._inbox.get(timeout=max(timeout_s, 0))
        except queue.Empty:
            return None
        if isinstance(item, Exception):
            self._inbox.put(item)
            if isinstance(item, HostProtocolError):
                raise HostProtocolError(str(item))
            raise HostUnavailableError("The workflow host closed the connection.")
        if item.get("type") == "event":
            self.events.append(item)
        return item

    def _read_message(self) -> dict[str, Any]:
        message = self._next(self.timeout_s)
        if message is None:
            raise HostUnavailableError("The workflow host did not answer in time.")
        return message

    def close(self) -> None:
        # Wake the reader thread first: closing its file while it reads would block.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        super().close()

    def next_event(self, timeout_s: float) -> dict[str, Any] | None:
        """The next pushed event, waiting at most `timeout_s`; None if none came."""
        deadline = time.monotonic() + timeout_s
        while not self.events:
            if self._next(deadline - time.monotonic()) is None:
                return None
        return self.events.popleft()


class SessionClient:
    """One session seen from its chat client: coordinator, view, turns, submissions."""

    def __init__(
        self,
        home: Home,
        session_id: str,
        *,
        database_url: str | None = None,
        autostart: bool = True,
        coordinator: bool = True,
        timeout_s: float = 30.0,
    ) -> None:
        self.home = home
        self.session_id = session_id
        self.database_url = database_url
        self.autostart = autostart
        self.as_coordinator = coordinator
        self.timeout_s = timeout_s
        self.subscription_id = f"session-view-{secrets.token_hex(6)}"
        self.connection: SessionConnection | None = None
        self.epoch: str | None = None
        self.view: dict[str, Any] = {}

    # --- connection and view ---------------------------------------------------------------

    def open(self) -> dict[str, Any]:
        """Connect, watch the session (as its coordinator) and return the first view."""
        connect(self.home, self.database_url, autostart=self.autostart).close()
        self.connection = SessionConnection(self.home.socket_path, self.timeout_s)
        receipt = self._call(
            "view.session.watch",
            {
                "subscriptionId": self.subscription_id,
                "sessionId": self.session_id,
                "coordinator": self.as_coordinator,
            },
        )
        self.epoch = receipt.get("coordinatorEpoch")
        return self.wait_for(lambda view: True, what="the first session view")

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def __enter__(self) -> SessionClient:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _conn(self) -> SessionConnection:
        if self.connection is None:
            raise PiWorkflowsError("The session client is not open; call open() first.")
        return self.connection

    def send(self, operation: str, payload: dict[str, Any], **kwargs: Any) -> Response:
        return self._conn().request(operation, payload, **kwargs)

    def _call(self, operation: str, payload: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """The receipt of an operation whose receipt the protocol defines as an object."""
        reply = self.send(operation, payload, **kwargs)
        if not reply.ok:
            raise RequestFailed(reply)
        receipt: dict[str, Any] = reply.receipt
        return receipt

    def _take_events(self, timeout_s: float) -> bool:
        """Apply pushed snapshots; True if at least one arrived."""
        seen = False
        event = self._conn().next_event(timeout_s)
        while event is not None:
            if (
                event.get("event") == "session_snapshot"
                and event.get("subscriptionId") == self.subscription_id
            ):
                self.view = event["payload"]
                seen = True
            event = self._conn().next_event(0)
        return seen

    def wait_for(
        self,
        predicate: Callable[[dict[str, Any]], Any],
        *,
        timeout_s: float | None = None,
        what: str = "the session view",
    ) -> dict[str, Any]:
        """Follow pushed views until `predicate(view)` holds; return that view."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        self._take_events(0)
        while not (self.view and predicate(self.view)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"Timed out waiting for {what} of session {self.session_id}.")
            self._take_events(remaining)
        return self.view

    def message(self, message_id: str) -> dict[str, Any]:
        messages: list[dict[str, Any]] = self.view.get("workflowMessages", [])
        for message in messages:
            if message["workflowMessageId"] == message_id:
                return message
        raise PiWorkflowsError(f"Workflow message {message_id} is not in the session view.")

    # --- branch, delivery and turns --------------------------------------------------------

    def branch_entries(self) -> list[dict[str, str]]:
        """This client's branch: every message the host already saw it show."""
        return [
            {"workflowMessageId": m["workflowMessageId"], "sessionEntryId": m["sessionEntryId"]}
            for m in self.view.get("workflowMessages", [])
            if m["status"] == "sent"
        ]

    def report_branch(
        self,
        *,
        is_idle: bool = True,
        has_pending: bool = False,
        extra: list[dict[str, str]] | None = None,
    ) -> dict[str, Any]:
        """Tell the host which messages the branch shows (idle: nothing is running)."""
        return self._call(
            "workflowMessage.reportBranch",
            {
                "targetSessionId": self.session_id,
                "coordinatorEpoch": self.epoch,
                "entries": self.branch_entries() + list(extra or []),
                "isIdle": is_idle,
                "hasPendingMessages": has_pending,
            },
        )

    def deliver_next(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for the next message to show, show it, and report it sent."""
        view = self.wait_for(
            lambda v: v.get("nextWorkflowMessageId"),
            timeout_s=timeout_s,
            what="a workflow message to show",
        )
        message = self.message(view["nextWorkflowMessageId"])
        entry = {
            "workflowMessageId": message["workflowMessageId"],
            "sessionEntryId": f"entry-{secrets.token_hex(8)}",
        }
        self.report_branch(is_idle=message["kind"] not in TURN_KINDS, extra=[entry])
        self.wait_for(
            lambda v: any(
                m["workflowMessageId"] == entry["workflowMessageId"] and m["status"] == "sent"
                for m in v["workflowMessages"]
            ),
            what="the host to record the shown message",
        )
        return self.message(entry["workflowMessageId"])

    def report_turn(
        self,
        message: dict[str, Any],
        turn_id: str,
        state: str,
        *,
        stop_reason: str | None = None,
        response_entry_id: str | None = None,
        error: str | None = None,
    ) -> Response:
        """Report a model turn started or ended for `message`; the receipt decides ownership.
        `error` says what failed in an `error` end (the run then fails with it)."""
        payload: dict[str, Any] = {
            "state": state,
            "workflowTurnId": turn_id,
            "workflowMessageId": message["workflowMessageId"],
            "runId": message["runId"],
            "targetSessionId": self.session_id,
            "coordinatorEpoch": self.epoch,
        }
        if state == "ended":
            payload["stopReason"] = stop_reason
            payload["responseSessionEntryId"] = response_entry_id
            if error is not None:
                payload["error"] = error
        return self.send("workflowTurn.report", payload, run_id=message["runId"])

    @staticmethod
    def new_turn_id() -> str:
        return f"workflow-turn-{secrets.token_hex(12)}"

    # --- step outputs ------------------------------------------------------------------------

    def _interaction(self, request_id: str) -> dict[str, Any]:
        view = self.wait_for(
            lambda v: any(i["requestId"] == request_id for i in v["pendingInteractions"]),
            what=f"interaction {request_id} to be pending",
        )
        return next(i for i in view["pendingInteractions"] if i["requestId"] == request_id)

    def _step_request(
        self, operation: str, message: dict[str, Any], extra: dict[str, Any]
    ) -> Response:
        details = message["details"]
        interaction = self._interaction(details["requestId"])
        coordinates = {k: details[k] for k in ("requestId", "attempt", "step")}
        return self.send(
            operation,
            {**coordinates, **extra},
            run_id=message["runId"],
            expected_revision=interaction["revision"],
        )

    def submit(
        self, message: dict[str, Any], value: Any, *, submission_id: str | None = None
    ) -> Response:
        """Submit a step's output; the host answers after the node's validator decided."""
        key = submission_id or f"submission-{secrets.token_hex(8)}"
        return self._step_request(
            "interaction.submit", message, {"submissionId": key, "value": value}
        )

    def update(self, message: dict[str, Any], update: dict[str, Any]) -> Response:
        """Publish a progress update for the step `message` asks for."""
        return self._step_request("interaction.update", message, {"value": {"update": update}})

    def respond(
        self,
        message: dict[str, Any],
        output: Any = None,
        *,
        submit: bool = True,
        stop_reason: str = "completed",
    ) -> dict[str, Any]:
        """One whole model turn on `message`: start, submit (steps), end.

        Returns ``{start, submission?, end}`` with each response's outcome and receipt.
        """
        turn_id = self.new_turn_id()
        start = self.report_turn(message, turn_id, "started")
        result: dict[str, Any] = {"start": _plain(start)}
        if not start.ok or start.receipt["ownership"] != "active":
            return result
        if submit and message["kind"] == "step":
            result["submission"] = _plain(self.submit(message, output))
        end = self.report_turn(
            message,
            turn_id,
            "ended",
            stop_reason=stop_reason,
            response_entry_id=f"entry-{secrets.token_hex(8)}",
        )
        result["end"] = _plain(end)
        return result


def _plain(response: Response) -> dict[str, Any]:
    plain: dict[str, Any] = {"outcome": response.outcome, "receipt": response.receipt}
    if response.error:
        plain["error"] = response.error
    return plain
