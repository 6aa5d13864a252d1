"""The worker's backend answers the reads worker.ready already answered without a
message; any other read goes to the host over the protocol pipe."""

from __future__ import annotations

import os

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
