"""High-level client calls: the operations of SPEC §8 as Python methods."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, cast

from ..errors import (
    ClientClosedError,
    HostBusyError,
    HostProtocolError,
    HostUnavailableError,
    NotFoundError,
    RunWaitTimedOut,
)
from ..home import Home
from ..protocol.framing import valid_id
from .autostart import connect
from .connection import HostConnection, RequestFailed, Response
from .session_client import SessionConnection

TERMINAL_STATUSES = ("completed", "failed", "timed_out", "cancelled")
WATCH_TICK_S = 1.0


def run_is_held(status: dict[str, Any]) -> bool:
    """Paused, or parked with an error code (no progress, crash loop, changed source,
    ambiguous effect): nothing moves until an operator acts."""
    if status.get("paused") and status["status"] not in TERMINAL_STATUSES:
        return True
    return status["queueStatus"] == "parked" and status.get("errorCode") is not None


def run_has_settled(status: dict[str, Any]) -> bool:
    """Nothing more happens without someone: terminal, waiting for input, or held."""
    return (
        status["status"] in TERMINAL_STATUSES
        or status["status"] == "waiting"
        or run_is_held(status)
    )


def run_succeeded(status: dict[str, Any]) -> bool:
    """Exit 0 material: completed, or waiting at a checkpoint or decision (not held)."""
    if status["status"] == "completed":
        return True
    return status["status"] == "waiting" and not run_is_held(status)


# What every run view (`run.status`, each item of `run.list`) has, and each one's type.
RUN_VIEW_FIELDS: dict[str, type | tuple[type, ...]] = {
    "runId": str,
    "workflowName": str,
    "status": str,
    "queueStatus": str,
    "paused": bool,
    "revision": int,
}


def checked_run_view(view: Any, run_id: str | None = None) -> dict[str, Any]:
    """`view` if it is a run view (of `run_id`, when given); a `HostProtocolError` saying
    "invalid run view" otherwise, never a KeyError in the caller."""
    fault = None
    if not isinstance(view, dict):
        fault = "not an object"
    else:
        for field, kind in RUN_VIEW_FIELDS.items():
            if not isinstance(view.get(field), kind):
                fault = f"no {field}"
                break
        else:
            if run_id is not None and view["runId"] != run_id:
                fault = f"the view is of run {str(view['runId'])[:64]}"
    if fault is not None:
        raise HostProtocolError(
            f"The workflow host sent an invalid run view for {run_id or 'a run'}: {fault}."
        )
    checked: dict[str, Any] = view
    return checked


class WorkflowClient:
    """Talks to the host of one home; starts it on demand unless `autostart=False`."""

    def __init__(self, home: Home, database_url: str | None = None, *, autostart: bool = True):
        self.home = home
        self.database_url = database_url
        self.autostart = autostart
        # One client id for the client's life: a retry on a new connection is the same
        # request from the same client, which the host adopts.
        self.client_id = f"client-{secrets.token_hex(8)}"
        self._connection: HostConnection | None = None
        # A second connection for the run status the host pushes (`wait_for_run`).
        self._watch: SessionConnection | None = None
        self._closed = False

    @property
    def connection(self) -> HostConnection:
        if self._closed:
            raise ClientClosedError(
                "Workflow client is closed; create a new WorkflowClient to talk to the host."
            )
        if self._connection is None:
            self._connection = connect(
                self.home, self.database_url, autostart=self.autostart, client_id=self.client_id
            )
        return self._connection

    @property
    def hello(self) -> dict[str, Any] | None:
        """The host's hello of the open connection (None before the first request)."""
        return self._connection.hello if self._connection is not None else None

    def close(self) -> None:
        """Close the connections; every later call raises `ClientClosedError` (closing
        again is allowed)."""
        self._closed = True
        self._drop_connections()

    def _drop_connections(self) -> None:
        """Close the connections; the next call opens a new one (a lost or broken one)."""
        self._close_watch()
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def call(self, operation: str, payload: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """Send a request and return its receipt; raise `RequestFailed` otherwise."""
        response = self.send(operation, payload, **kwargs)
        if not response.ok:
            raise RequestFailed(response)
        return response.receipt

    def call_object(
        self, operation: str, payload: dict[str, Any] | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """`call` for an operation whose receipt the protocol defines as a JSON object."""
        return cast(dict[str, Any], self.call(operation, payload, **kwargs))

    def call_list(
        self, operation: str, payload: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[dict[str, Any]]:
        """`call` for an operation whose receipt the protocol defines as a list of objects."""
        return cast(list[dict[str, Any]], self.call(operation, payload, **kwargs))

    def send(
        self, operation: str, payload: dict[str, Any] | None = None, **kwargs: Any
    ) -> Response:
        """Send a request and return the raw response, whatever its outcome.

        A connection lost mid-request is retried once on a new connection with the same
        request id and idempotency key: a command the host already applied is adopted,
        never applied twice.
        """
        kwargs.setdefault("request_id", f"request-{secrets.token_hex(12)}")
        connection = self.connection  # failing to connect at all is not retried
        try:
            return connection.request(operation, payload, **kwargs)
        except HostUnavailableError:
            self._drop_connections()
        except HostProtocolError:
            self._drop_connections()  # the next call starts on a new connection
            raise
        return self.connection.request(operation, payload, **kwargs)

    def start_run(self, payload: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        receipt = self.call("run.start", payload, **kwargs)
        if not isinstance(receipt, dict) or not valid_id(receipt.get("runId")):
            raise HostProtocolError("The workflow host sent an invalid run.start receipt.")
        return receipt

    def start_runs(self, payloads: list[dict[str, Any]], **kwargs: Any) -> list[dict[str, Any]]:
        """Start several runs in one request and one commit (all or none, at most 1000).

        Returns ``[{runId, status}, ...]`` in the order of `payloads`.
        """
        runs: list[dict[str, Any]] = self.call_object(
            "run.startBatch", {"runs": payloads}, **kwargs
        )["runs"]
        return runs

    def start_runs_pipelined(self, payloads: list[dict[str, Any]]) -> list[Response]:
        """Start each run with its own `run.start` request, sending the next requests
        before the answers come (the host commits the starts that arrive together in
        one transaction; each is answered after the commit that holds it).

        Returns one response per payload, in order; each is accepted or refused on its
        own. A lost connection is retried once with the same request ids, as `send`
        retries one request.
        """
        request_ids = [f"request-{secrets.token_hex(12)}" for _ in payloads]
        connection = self.connection
        try:
            return connection.request_pipelined("run.start", payloads, request_ids)
        except HostUnavailableError:
            self._drop_connections()
        except HostProtocolError:
            self._drop_connections()
            raise
        return self.connection.request_pipelined("run.start", payloads, request_ids)

    def run_status(self, run_id: str) -> dict[str, Any] | None:
        """The run's `run status --json` object; None when the host knows no such run."""
        response = self.send("run.status", {}, run_id=run_id)
        if response.outcome == "notFound":
            return None
        if not response.ok and response.error is None:
            raise HostProtocolError(
                f"The workflow host sent an invalid run view for {run_id}: "
                f"{response.outcome} without an error."
            )
        if not response.ok:
            raise RequestFailed(response)
        return checked_run_view(response.receipt, run_id)

    def known_run_status(self, run_id: str) -> dict[str, Any]:
        """`run_status` of a run that must exist: `NotFoundError` when it does not."""
        status = self.run_status(run_id)
        if status is None:
            raise NotFoundError(
                f"Workflow run {run_id} does not exist; see 'pi-workflows run list'."
            )
        return status

    def run_graph(self, run_id: str) -> dict[str, Any]:
        """The run's graph for a viewer: `{runId, definitionDigest, definition, steps,
        current, run}` — the definition snapshot it was started with (None if its client
        sent none), its finished steps in order, the attempt running now and the run's
        `run.status` object."""
        graph = self.call("run.graph", {}, run_id=run_id)
        if not isinstance(graph, dict) or not isinstance(graph.get("steps"), list):
            raise HostProtocolError(f"The workflow host sent an invalid run graph for {run_id}.")
        checked_run_view(graph.get("run"), run_id)
        return graph

    def why_run(self, run_id: str) -> dict[str, Any]:
        """What holds the run now: `{runId, status, reason, code, since, until, next}`."""
        return self.call_object("run.why", {}, run_id=run_id)

    def run_transcript(self, run_id: str, node_id: str | None = None) -> list[dict[str, Any]]:
        """The stored agent transcripts of the run's attempts (only `node_id`'s when given)."""
        payload = {} if node_id is None else {"nodeId": node_id}
        return self.call_list("run.transcript", payload, run_id=run_id)

    def list_runs(
        self,
        limit: int = 100,
        *,
        before: str | None = None,
        status: str | None = None,
        workflow: str | None = None,
    ) -> list[dict[str, Any]]:
        """The newest runs first; with `before`, the page after that run."""
        filters = {"before": before, "status": status, "workflow": workflow}
        payload = {"limit": limit, **{k: v for k, v in filters.items() if v is not None}}
        runs = self.call("run.list", payload)
        if not isinstance(runs, list):
            raise HostProtocolError("The workflow host sent an invalid run list: not a list.")
        return [checked_run_view(run) for run in runs]

    def cancel_run(self, run_id: str) -> dict[str, Any]:
        return self.call_object("run.cancel", {}, run_id=run_id)

    def pause_run(self, run_id: str) -> dict[str, Any]:
        return self.call_object("run.pause", {}, run_id=run_id)

    def resume_run(self, run_id: str) -> dict[str, Any]:
        return self.call_object("run.resume", {}, run_id=run_id)

    def restart_run(
        self, run_id: str, expected_revision: int, workflow_message_id: str | None = None
    ) -> dict[str, Any]:
        """Restart a finished interactive run from its latest terminal message.

        `expected_revision` is the revision of the run as the caller saw it finish
        (`run_status(run_id)["revision"]`); a run that changed since is a conflict.
        """
        payload = {} if workflow_message_id is None else {"workflowMessageId": workflow_message_id}
        return self.call_object(
            "run.restart", payload, run_id=run_id, expected_revision=expected_revision
        )

    def answer_checkpoint(self, run_id: str, answer: Any) -> dict[str, Any]:
        """Answer RUN's checkpoint; returns `{parentRunId, runId}` of its continuation."""
        return self.call_object("checkpoint.answer", {"input": answer}, run_id=run_id)

    def list_decisions(self, *, include_resolved: bool = False) -> list[dict[str, Any]]:
        return self.call_list("decision.list", {"all": include_resolved})

    def answer_decision(
        self, decision_id: str, choice: str, input: Any = None, **source: Any
    ) -> Response:
        """Answer a human decision (`source`: `channel`, `sessionId`); the raw response.

        A late answer comes back as `conflict` with a receipt naming the winner.
        """
        payload = {"decisionId": decision_id, "choice": choice, **source}
        if input is not None:
            payload["input"] = input
        return self.send("decision.answer", payload)

    def list_effects(
        self, *, status: str | None = None, run_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Effects newest first, optionally only those with `status` or of one run."""
        payload = {k: v for k, v in (("status", status), ("runId", run_id)) if v is not None}
        return self.call_list("effects.list", payload)

    def confirm_effect(self, effect_id: str, result: Any = None) -> dict[str, Any]:
        """An effect in doubt did happen: its node completes with `result`."""
        return self.call_object("effects.confirm", {"effectId": effect_id, "result": result})

    def retry_effect(self, effect_id: str) -> dict[str, Any]:
        """An effect in doubt did not happen: its node runs it again."""
        return self.call_object("effects.retry", {"effectId": effect_id})

    def prune_state(
        self,
        before: str,
        *,
        apply: bool,
        backup_path: Path | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """`state.prune`: the host prunes what finished before `before` (ISO 8601) and
        answers with the prune report; `on_progress` gets the counts so far after each of
        its transactions (they also keep a long prune's connection from timing out)."""
        payload: dict[str, Any] = {"before": before, "apply": apply}
        if backup_path is not None:
            payload["backupPath"] = str(backup_path)

        def progress(event: dict[str, Any]) -> None:
            if on_progress is not None and event["event"] == "prune_progress":
                on_progress(event["payload"])

        return self.call_object("state.prune", payload, on_event=progress)

    def host_status(self) -> dict[str, Any]:
        return self.call_object("host.status")

    def stop_host(self) -> dict[str, Any]:
        return self.call_object("host.stop")

    def wait_for_run(
        self,
        run_id: str,
        *,
        timeout_s: float | None = None,
        until: Callable[[dict[str, Any]], bool] | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        poll_s: float = 0.05,
    ) -> dict[str, Any]:
        """Wait until the run is terminal, waiting or held (or `until` says so); return
        its `run.status` object.

        The host pushes the status each time it changes (`view.run.watch` with
        `statusOnly`), so the wait costs neither a poll interval nor a request per poll;
        `run.status` is polled every `poll_s` only when that watch cannot be had.
        `on_progress` sees every status the wait does not end on whose `status` moved.
        """
        until = until or run_has_settled
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        status: dict[str, Any] | None = None
        last_status = None
        with contextlib.closing(self._statuses(run_id, deadline, poll_s)) as statuses:
            for status in statuses:
                if until(status):
                    return status
                if on_progress is not None and status["status"] != last_status:
                    on_progress(status)
                last_status = status["status"]
        assert status is not None
        raise RunWaitTimedOut(
            f"Run {run_id} is still {status['status']} after waiting {timeout_s:g} s; "
            f"it goes on in the host: check it with 'pi-workflows run status {run_id}'."
        )

    def _statuses(
        self, run_id: str, deadline: float | None, poll_s: float
    ) -> Generator[dict[str, Any], None, None]:
        """The run's status objects as they change, at least one, until `deadline`."""
        try:
            if (yield from self._pushed_statuses(run_id, deadline)):
                return
        except (HostUnavailableError, HostBusyError):
            self._close_watch()  # the host went away or is full: poll instead
        while True:
            yield self.known_run_status(run_id)
            if deadline is not None and time.monotonic() >= deadline:
                return
            time.sleep(poll_s)

    def _pushed_statuses(
        self, run_id: str, deadline: float | None
    ) -> Generator[dict[str, Any], None, bool]:
        """Statuses pushed until `deadline`; returns whether any came."""
        if self._watch is None:
            _ = self.connection  # connect first: that starts the host when allowed
            self._watch = SessionConnection(self.home.socket_path)
        watch = self._watch
        subscription = f"run-wait-{secrets.token_hex(6)}"
        reply = watch.request(
            "view.run.watch", {"subscriptionId": subscription, "statusOnly": True}, run_id=run_id
        )
        if not reply.ok:
            raise RequestFailed(reply)
        pushed = False
        try:
            while True:
                wait_s = WATCH_TICK_S if deadline is None else deadline - time.monotonic()
                event = watch.next_event(max(wait_s, 0))
                if event is not None and event.get("subscriptionId") == subscription:
                    pushed = True
                    yield event["payload"]
                if deadline is not None and time.monotonic() >= deadline:
                    return pushed
        finally:
            # Not waited for: the run's status is the caller's already.
            with contextlib.suppress(HostUnavailableError):
                watch.post("view.unwatch", {"subscriptionId": subscription})

    def _close_watch(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None
