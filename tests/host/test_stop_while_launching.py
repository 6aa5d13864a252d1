"""A host told to stop still stops: while the fork server answers its launches, and
when it is told twice; a client that connects as it stops is not left waiting.

The plugin below holds the host's event loop inside the last launch of a claim pass
until the fork server has answered every launch before it, with the host's own SIGTERM
already pending: the host reads those answers and starts stopping in the same loop
passes, the moment a launch's answer and `ForkServer.close()` cross.
"""

from __future__ import annotations

import signal
import socket
import subprocess

import psutil
import pytest

from pi_workflows.testing import process_gone

from .conftest import HostHarness, wait_until
from .workflows import STEPS

RUNS = 4
STOP_DEADLINE_S = 15.0  # the test kit's own patience with a stopping host

STOP_AMID_LAUNCHES = f"""
import os
import signal
import time
from pathlib import Path

import psutil

from pi_workflows import hookimpl

RUNS = {RUNS}
launches = 0


def _fork_server():
    for child in psutil.Process().children():
        if "--zygote" in " ".join(child.cmdline()):
            return child
    return None


@hookimpl
def piw_worker_process(envelope, settings):
    global launches
    launches += 1
    stopped = Path.cwd() / "stopped-once"  # only the first host stops itself
    # The first launch is the warm-up run's, which starts the fork server.
    if launches == 1 + RUNS and not stopped.exists():
        stopped.touch()
        os.kill(os.getpid(), signal.SIGTERM)
        # Every earlier launch was sent; its answer is in once the fork server has a
        # worker for it and has forked its next spare.
        zygote, deadline = _fork_server(), time.monotonic() + 10
        while zygote and len(zygote.children()) < RUNS and time.monotonic() < deadline:
            time.sleep(0.005)
    return None
"""


def _zygote_children(host: subprocess.Popen) -> list[psutil.Process] | None:
    for child in psutil.Process(host.pid).children():
        if "--zygote" in " ".join(child.cmdline()):
            return child.children()
    return None


def _workers_in(harness: HostHarness) -> list[psutil.Process]:
    """Live processes working in the project (workers run there)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.cwd() == str(harness.project) and process.status() != "zombie":
                found.append(process)
        except psutil.Error:
            continue
    return found


@pytest.mark.integration
def test_a_host_stopped_while_forked_workers_are_answered_exits(harness: HostHarness):
    harness.write_workflow("steps", STEPS)
    harness.add_plugin("stop_amid_launches", STOP_AMID_LAUNCHES)
    # Room for more workers than runs: one claim pass claims them all.
    host = harness.start_host(PI_WORKFLOWS_MAX_WORKERS=str(4 * RUNS))
    # A warm-up run's launch starts the fork server; the runs' launches then go to it.
    warm_up = harness.start_run("hello", {"name": "warm-up"})
    assert harness.wait_for_status(warm_up, "completed")["status"] == "completed"
    wait_until(lambda: _zygote_children(host), what="the fork server's spare")
    run_ids = harness.start_runs("steps", RUNS)  # one batch: one claim pass takes them all
    try:
        assert host.wait(timeout=STOP_DEADLINE_S) == 0
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the host did not stop:\n{harness.host_log()}") from None
    rows = harness.query("SELECT status FROM run_workers WHERE run_id != ?", warm_up)
    assert len(rows) == RUNS and {status for (status,) in rows} == {"orphaned"}
    wait_until(lambda: not _workers_in(harness), what="the stopped host's workers to exit")

    # The next host claims the runs again and finishes them; no completed node re-runs.
    harness.start_host()
    (harness.project / "release-b").touch()
    for run_id in run_ids:
        assert harness.wait_for_run(run_id)["status"] == "completed"
    assert (
        harness.query(
            "SELECT run_id, node_id FROM node_attempts WHERE status = 'completed' "
            "GROUP BY run_id, node_id HAVING COUNT(*) > 1"
        )
        == []
    )


# A worker of this workflow ignores SIGTERM, so its host's stop waits out the grace
# period before the SIGKILL. (Only a worker: the client imports the workflow too.)
STUBBORN = """
import os
import signal
import time

from pi_workflows import compute, workflow

if "PI_WORKFLOWS_WORKER_LAUNCH" in os.environ:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def wait(ctx):
    with open("stubborn.pid", "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(120)


WORKFLOW = workflow(name="stubborn", start_at="wait", nodes={"wait": compute(wait)}, edges=[])
"""


@pytest.mark.integration
def test_a_second_sigterm_during_a_stop_does_not_make_the_stop_wait_for_itself(
    harness: HostHarness,
):
    host, worker = _stop_amid_a_stubborn_node(harness)
    wait_until(lambda: not _answers(harness), what="the host to stop listening")
    # Still in its grace period (a killed worker can linger as a zombie, which counts as gone).
    assert not process_gone(worker)
    host.send_signal(signal.SIGTERM)
    try:
        assert host.wait(timeout=STOP_DEADLINE_S) == 0
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the host did not stop:\n{harness.host_log()}") from None
    assert "still busy" not in harness.host_log()  # the stop waited for no one forever


def _stop_amid_a_stubborn_node(harness: HostHarness) -> tuple[subprocess.Popen, int]:
    """A host SIGTERMed while its worker ignores SIGTERM; the host and the worker's pid."""
    harness.write_workflow("stubborn", STUBBORN)
    host = harness.start_host()
    harness.start_run("stubborn")
    worker = harness.wait_for_pid("stubborn.pid")
    host.send_signal(signal.SIGTERM)
    return host, worker


def _answers(harness: HostHarness) -> bool:
    try:
        harness.status()
    except Exception:
        return False
    return True


@pytest.mark.integration
def test_a_client_that_connects_as_the_host_stops_hears_so_before_it_exits(
    harness: HostHarness,
):
    host, worker = _stop_amid_a_stubborn_node(harness)
    # Connect until the host no longer listens: the first connections cross the stop's
    # start. Each one ends (greeted or not) while the host still stops, its stubborn
    # worker in its grace period; none waits for the host's process to exit.
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(STOP_DEADLINE_S)
            try:
                client.connect(str(harness.home.socket_path))
            except (ConnectionRefusedError, FileNotFoundError):
                break
            _read_to_the_end(client)
        assert host.poll() is None and not process_gone(worker), "the client waited for the exit"
    assert host.wait(timeout=STOP_DEADLINE_S) == 0


def _read_to_the_end(client: socket.socket) -> None:
    try:
        while client.recv(65536):
            pass
    except ConnectionResetError:
        pass
