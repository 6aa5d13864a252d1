"""The worker's end of the worker protocol: numbered messages, fenced responses."""

from __future__ import annotations

import json
import queue
import secrets
import threading
from collections.abc import Callable
from typing import IO, Any

from ..canonical import canonical_json
from ..errors import ClaimLostError, PiWorkflowsError, RevisionConflictError
from ..protocol.framing import MAX_WORKER_FRAME_BYTES
from ..protocol.worker_messages import (
    LAUNCH_SCHEMA,
    LEASE_OUTCOME,
    MESSAGE_SCHEMA,
    PREPARED_OUTCOME,
    WorkerKind,
    WorkerOperation,
    message_kind,
)
from .lease_fence import LeaseFence

# A thread started ahead to read the next HostPipe's frames (`start_reader_ahead`).
_reader_ahead: queue.SimpleQueue[Callable[[], None]] | None = None


def start_reader_ahead() -> None:
    """In a spare worker, while it waits for its launch: start the thread that will
    read the host's frames. Started at launch, it held up every launch for 1-2 ms in a
    worker just forked on busy cores, before the workflow was even loaded."""
    global _reader_ahead
    jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
    threading.Thread(
        target=lambda: jobs.get()(), name="pi-workflows-host-pipe", daemon=True
    ).start()
    _reader_ahead = jobs


def _start_reader(read: Callable[[], None]) -> None:
    global _reader_ahead
    jobs, _reader_ahead = _reader_ahead, None
    if jobs is not None:
        jobs.put(read)
    else:
        threading.Thread(target=read, name="pi-workflows-host-pipe", daemon=True).start()


class HostPipe:
    """Sends one message at a time and waits for its response.

    One exception: when worker.ready's answer came with the launch (the host's first
    frame, outcome `prepared`), the reply to worker.ready is read just before the reply
    to the next message, so the worker reaches its first write without waiting for it.

    A thread reads every frame as it comes: the host's fence times (outcome `lease`,
    sent unasked) go straight to `fence`, whatever the engine is doing; replies wait in
    a queue for the call that reads them.
    """

    def __init__(self, envelope: dict[str, Any], reader: IO[bytes], writer: IO[bytes]) -> None:
        self.envelope = envelope
        self.reader = reader
        self.writer = writer
        self.revision = 0
        self.fence = LeaseFence()
        # worker.ready was sent and answered at launch; its own reply is still unread.
        self._ready_reply_unread = False
        # Replies in order; then None at end-of-file, or what made reading fail.
        self._replies: queue.SimpleQueue[dict[str, Any] | Exception | None] = queue.SimpleQueue()
        _start_reader(self._read_frames)

    def ready(self) -> dict[str, Any]:
        """Say worker.ready; its answer: the one sent with the launch, else the reply."""
        self._send(WorkerOperation.READY, {}, kind=None, attempt_id=None, control=True)
        reply = self._read_reply(prepared=True)
        if reply.get("outcome") == PREPARED_OUTCOME:
            self._ready_reply_unread = True
        return self._accept(reply, WorkerOperation.READY)

    def call(
        self,
        operation: WorkerOperation,
        payload: dict[str, Any],
        *,
        kind: WorkerKind | None = None,
        attempt_id: str | None = None,
        control: bool = False,
    ) -> Any:
        self._send(operation, payload, kind=kind, attempt_id=attempt_id, control=control)
        if self._ready_reply_unread:
            # The claim check of worker.ready: a lost claim stops the worker here, before
            # it acts on any answer to the message it just sent.
            self._ready_reply_unread = False
            self._accept(self._read_reply(), WorkerOperation.READY)
        return self._accept(self._read_reply(), operation)

    def _send(
        self,
        operation: WorkerOperation,
        payload: dict[str, Any],
        *,
        kind: WorkerKind | None,
        attempt_id: str | None,
        control: bool,
    ) -> None:
        message: dict[str, Any] = {
            "schema": MESSAGE_SCHEMA,
            "launchSchema": LAUNCH_SCHEMA,
            "messageId": f"message-{secrets.token_hex(12)}",
            "kind": kind or message_kind(operation),
            "operation": operation,
            "runId": self.envelope["runId"],
            "generation": self.envelope["generation"],
            "workerEpoch": self.envelope["workerEpoch"],
            "expectedRevision": 0 if control else self.revision,
            "payload": payload,
        }
        if attempt_id is not None:
            message["attemptId"] = attempt_id
        self.writer.write(canonical_json(message).encode("utf-8") + b"\n")
        self.writer.flush()

    def _read_reply(self, *, prepared: bool = False) -> dict[str, Any]:
        """The next reply; an answer sent with the launch is skipped unless `prepared`
        (a worker that fails to load says worker.exiting instead of worker.ready)."""
        while True:
            reply = self._replies.get()
            if not isinstance(reply, dict):
                self._replies.put(reply)  # every later read ends the same way
                if reply is None:
                    raise ClaimLostError("The workflow host closed the worker channel.")
                raise reply
            if prepared or reply.get("outcome") != PREPARED_OUTCOME:
                return reply

    def _read_frames(self) -> None:
        try:
            while line := self.reader.readline(MAX_WORKER_FRAME_BYTES + 1):
                frame = json.loads(line)
                if frame.get("outcome") == LEASE_OUTCOME:
                    self.fence.extend(frame["result"]["fenceAtMs"])
                else:
                    self._replies.put(frame)
        except Exception as error:  # a broken frame fails the call that waits for it
            self._replies.put(error)
            return
        self._replies.put(None)

    def _accept(self, reply: dict[str, Any], operation: str) -> Any:
        if isinstance(reply.get("revision"), int):
            self.revision = reply["revision"]
        outcome = reply.get("outcome")
        if outcome == "claimLost":
            raise ClaimLostError(reply.get("error") or "The run's claim was lost.")
        if outcome == "rejected":
            error = reply.get("error") or f"The host rejected {operation}."
            if "revision conflict" in error:
                raise RevisionConflictError(error)
            raise PiWorkflowsError(error)
        return reply.get("result")
