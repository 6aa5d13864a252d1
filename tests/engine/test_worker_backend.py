"""The worker's backend answers the reads worker.ready already answered without a
message; any other read goes to the host over the protocol pipe; the run's last write
goes with the worker's goodbye."""

from __future__ import annotations

import json
import os
import threading

import pytest

from pi_workflows.errors import ClaimLostError
from pi_workflows.worker.host_backend import HostRunBackend
from pi_workflows.worker.host_pipe import HostPipe


def test_the_run_and_its_parent_are_read_once_from_worker_ready():
    from_host, to_worker = os.pipe()
    os.close(to_worker)  # a host that answers nothing more: any message fails
    from_worker, to_host = os.pipe()
    envelope = {"runId": "run-1", "generation": 1, "workerEpoch": "epoch-1"}
    pipe = HostPipe(envelope, os.fdopen(from_host, "rb"), os.fdopen(to_host, "wb"))
    run, parent = {"state": {"status": "queued"}}, {"state": {"status": "waiting"}}
    backend = HostRunBackend(pipe, {None: run, "parent-1": parent})
    try:
        assert backend.read_run_state() is run
        assert backend.read_run_state("parent-1") is parent
        os.set_blocking(from_worker, False)
        with pytest.raises(BlockingIOError):  # nothing was sent so far
            os.read(from_worker, 1)
        with pytest.raises(ClaimLostError):  # a second read asks the host
            backend.read_run_state("parent-1")
        assert b'"operation":"store.readRunState"' in os.read(from_worker, 65536)
    finally:
        pipe.reader.close()
        pipe.writer.close()
        os.close(from_worker)


def _answering_host(from_worker: int, to_worker: int) -> tuple[threading.Thread, list[dict]]:
    """The host's end of the pipes: answers each message `accepted`, keeps what it read."""
    received: list[dict] = []

    def serve() -> None:
        with os.fdopen(from_worker, "rb") as reader, os.fdopen(to_worker, "wb") as writer:
            for line in reader:
                message = json.loads(line)
                received.append(message)
                reply = {"messageId": message["messageId"], "outcome": "accepted", "result": {}}
                writer.write(json.dumps(reply).encode() + b"\n")
                writer.flush()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread, received


def test_the_run_s_last_write_and_the_worker_s_goodbye_are_one_message():
    from_worker, to_host = os.pipe()
    from_host, to_worker = os.pipe()
    host, received = _answering_host(from_worker, to_worker)
    envelope = {"runId": "run-1", "generation": 1, "workerEpoch": "epoch-1"}
    pipe = HostPipe(envelope, os.fdopen(from_host, "rb"), os.fdopen(to_host, "wb"))
    backend = HostRunBackend(pipe)
    node_finished = {"type": "node.finished", "nodeId": "c"}
    state = {"status": "running", "steps": [{"nodeId": "c"}]}
    backend.write_snapshot(state, node_finished)
    state["status"] = "completed"  # the engine changes its state in place
    state["steps"].append({"nodeId": "d"})
    backend.write_snapshot(state, {"type": "run.completed"})
    assert received == []  # both wait for the goodbye
    backend.finish("completed")
    # A worker with nothing held back says goodbye alone.
    backend.finish("completed")
    pipe.writer.close()
    host.join(10)
    pipe.reader.close()

    last_write, goodbye = received
    assert last_write["operation"] == "store.batch"
    steps = last_write["payload"]["steps"]
    assert [step["payload"]["trace_event"]["type"] for step in steps] == [
        "node.finished",
        "run.completed",
    ]
    # Each held snapshot went as it was when written.
    assert steps[0]["payload"]["snapshot"] == {"status": "running", "steps": [{"nodeId": "c"}]}
    assert steps[1]["payload"]["snapshot"]["steps"] == [{"nodeId": "c"}, {"nodeId": "d"}]
    assert last_write["payload"]["exiting"] == {"status": "completed"}
    assert goodbye["operation"] == "worker.exiting"
    assert goodbye["payload"] == {"status": "completed"}


def test_an_answer_sent_with_the_launch_stops_the_worker_when_worker_ready_is_refused():
    from_worker, to_host = os.pipe()
    from_host, to_worker = os.pipe()
    envelope = {"runId": "run-1", "generation": 1, "workerEpoch": "epoch-1"}
    pipe = HostPipe(envelope, os.fdopen(from_host, "rb"), os.fdopen(to_host, "wb"))
    sent = os.fdopen(from_worker, "rb")
    prepared = {"messageId": "worker.ready", "outcome": "prepared", "revision": 2}
    answer = {"command": {"kind": "start"}, "runState": {"state": None}}
    os.write(to_worker, json.dumps({**prepared, "result": answer}).encode() + b"\n")
    try:
        # Nothing answered worker.ready itself yet: the worker goes on with the answer.
        assert pipe.ready() == answer
        assert json.loads(sent.readline())["operation"] == "worker.ready"
        refused = {"messageId": "m", "outcome": "claimLost", "error": "Run claim expired"}
        accepted = {"messageId": "m", "outcome": "accepted", "result": {}, "revision": 3}
        for reply in (refused, accepted):
            os.write(to_worker, json.dumps(reply).encode() + b"\n")
        # worker.ready's reply is read before the write's: the refusal stops the worker.
        with pytest.raises(ClaimLostError, match="Run claim expired"):
            pipe.call("store.writeSnapshot", {"snapshot": {}})
        write = json.loads(sent.readline())
        assert (write["operation"], write["expectedRevision"]) == ("store.writeSnapshot", 2)
    finally:
        os.close(to_worker)  # first: the pipe's reading thread ends at end-of-file
        pipe.reader.close()
        pipe.writer.close()
        sent.close()


def test_a_worker_that_fails_to_load_skips_the_answer_sent_with_the_launch():
    from_worker, to_host = os.pipe()
    from_host, to_worker = os.pipe()
    host, received = _answering_host(from_worker, to_worker)
    prepared = {"messageId": "worker.ready", "outcome": "prepared", "result": {"command": {}}}
    os.write(to_worker, json.dumps(prepared).encode() + b"\n")
    envelope = {"runId": "run-1", "generation": 1, "workerEpoch": "epoch-1"}
    pipe = HostPipe(envelope, os.fdopen(from_host, "rb"), os.fdopen(to_host, "wb"))
    # worker.exiting's reply is the host's answer to it, not the launch's.
    assert pipe.call("worker.exiting", {"status": "workflowLoadFailed"}, control=True) == {}
    pipe.writer.close()
    host.join(10)
    pipe.reader.close()
    assert [message["operation"] for message in received] == ["worker.exiting"]


def test_a_pipe_reads_with_the_thread_a_spare_started_ahead_and_starts_none_of_its_own():
    from pi_workflows.worker import host_pipe

    host_pipe.start_reader_ahead()  # as a spare does while it waits for its launch
    threads = threading.active_count()
    envelope = {"runId": "run-1", "generation": 1, "workerEpoch": "epoch-1"}
    pipes = []
    for expected_threads in (threads, threads + 1):  # the next pipe starts its own
        from_worker, to_host = os.pipe()
        from_host, to_worker = os.pipe()
        pipe = HostPipe(envelope, os.fdopen(from_host, "rb"), os.fdopen(to_host, "wb"))
        pipes.append((pipe, from_worker, to_worker))
        assert threading.active_count() == expected_threads
        answer = {"command": {"kind": "start"}, "runState": {"state": None}}
        prepared = {"messageId": "worker.ready", "outcome": "prepared", "result": answer}
        os.write(to_worker, json.dumps(prepared).encode() + b"\n")
        assert pipe.ready() == answer  # read by the pipe's reading thread
    for pipe, from_worker, to_worker in pipes:
        os.close(to_worker)  # first: the pipe's reading thread ends at end-of-file
        pipe.reader.close()
        pipe.writer.close()
        os.close(from_worker)
