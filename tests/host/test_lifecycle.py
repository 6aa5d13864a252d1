"""Host lifecycle with real processes: single instance, crash takeover, clean stop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import struct
import subprocess
import time

import psutil
import pytest

from pi_workflows.host.forkserver import FORK_REPLY_TIMEOUT_S
from tests.polling import process_gone

from .conftest import HostHarness, request_frame, wait_until
from .workflows import STEPS, WORKER_MODULES


@pytest.mark.integration
@pytest.mark.scenario("1.2", "1.3")
def test_a_second_host_on_the_same_home_is_refused(harness: HostHarness):
    harness.write_workflow("steps", STEPS)
    first = harness.start_host()
    run_id = harness.start_run("steps")
    worker = harness.wait_for_pid("b.pid")  # a child the first host spawned and registered
    result = harness.cli("host", "run", check=False)
    assert result.returncode == 1
    assert f"A workflow host is already running with PID {first.pid}" in result.stderr
    assert first.poll() is None  # the first host is unharmed
    assert f"(PID {first.pid}, epoch " in harness.cli("host", "status").stdout
    # The refused host reaped nothing: the first host's worker still runs its node.
    assert psutil.pid_exists(worker)
    assert harness.workers(run_id) == [(1, "running", worker)]
    (harness.project / "release-b").touch()
    assert harness.wait_for_status(run_id, "completed")["finalOutput"] == {"sum": 3}


@pytest.mark.integration
@pytest.mark.sqlite_only
@pytest.mark.scenario("1.4")
def test_a_socket_that_cannot_be_bound_releases_the_epoch_and_the_lock(harness: HostHarness):
    home = harness.root / ("a" * 70) / ("b" * 70)
    result = harness.cli("host", "run", check=False, PI_WORKFLOWS_HOME=str(home))
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "is longer than the OS allows (107 bytes); choose a shorter --home" in result.stderr
    assert not (home / "host" / "host.lock.json").exists()
    assert not (home / "host" / "host.sock").exists()
    connection = sqlite3.connect(home / "state.sqlite")
    try:
        rows = connection.execute("SELECT host_id, pid, released_at FROM host_state").fetchall()
    finally:
        connection.close()
    assert [(host_id, pid) for host_id, pid, _ in rows] == [(None, None)]
    assert rows[0][2] is not None
    # Stopping the host that never started is safe.
    stopped = harness.cli("host", "stop", check=False, PI_WORKFLOWS_HOME=str(home))
    assert stopped.returncode == 0, stopped.stderr


def _connected(harness: HostHarness) -> socket.socket:
    """A raw client connection that has read the host's hello."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(15)
    client.connect(str(harness.home.socket_path))
    hello = b""
    while not hello.endswith(b"\n"):
        hello += client.recv(65536)
    assert json.loads(hello)["type"] == "hello"
    return client


@pytest.mark.integration
@pytest.mark.scenario("1.8")
def test_stop_closes_an_idle_client_connection_and_does_not_wait_for_it(harness: HostHarness):
    process = harness.start_host()
    idle = _connected(harness)
    try:
        harness.stop()
        assert idle.recv(65536) == b""  # the host closed it
    finally:
        idle.close()
    assert process.returncode == 0  # a clean stop, not the harness's kill after 15 s
    assert not harness.home.socket_path.exists()


@pytest.mark.integration
@pytest.mark.scenario("1.9")
def test_a_client_that_resets_its_connection_harms_no_other(harness: HostHarness):
    harness.start_host()
    for number in range(20):
        rude = _connected(harness)
        rude.sendall(request_frame(f"status-{number}", "host.status", {}))
        # Close with a reset (RST), before the answer is read.
        rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        rude.close()
    polite = _connected(harness)
    try:
        polite.sendall(request_frame("after", "host.status", {}))
        answer = json.loads(polite.makefile("rb").readline())
    finally:
        polite.close()
    assert answer["outcome"] == "accepted" and answer["receipt"]["state"] == "running"
    assert harness.host_process.poll() is None
    assert "Traceback" not in harness.host_log()


@pytest.mark.scenario("1.10")
def test_the_status_receipt_counts_runs_and_names_no_process(harness: HostHarness):
    harness.start_host()
    client = harness.client()
    try:
        receipt = client.host_status()
    finally:
        client.close()
    assert receipt["state"] == "running" and receipt["socketAvailable"] is True
    for count in ("activeWorkers", "queuedRuns", "pendingInteractions", "ambiguousEffects"):
        assert receipt[count] == 0
    assert receipt["lifecycleContradictions"] == 0
    # The process behind the socket is the lock file's business (`host status` reads it).
    assert not {"pid", "hostId", "processStartIdentity", "startIdentity"} & set(receipt)


@pytest.mark.integration
@pytest.mark.scenario("1.1")
def test_host_start_is_idempotent_and_stop_removes_socket_and_lock(harness: HostHarness):
    started = json.loads(harness.cli("host", "start", "--json").stdout)
    again = json.loads(harness.cli("host", "start", "--json").stdout)
    assert started["alreadyRunning"] is False and again["alreadyRunning"] is True
    assert started["pid"] == again["pid"]
    assert oct(harness.home.socket_path.stat().st_mode & 0o777) == "0o600"
    harness.cli("host", "stop")
    assert not harness.home.socket_path.exists()
    assert not harness.home.lock_path.exists()
    assert process_gone(started["pid"])


@pytest.mark.integration
@pytest.mark.scenario("1.6", "2.3")
def test_host_sigkill_next_host_takes_a_higher_epoch_and_finishes_the_run(harness: HostHarness):
    harness.write_workflow("steps", STEPS)
    first = harness.start_host()
    first_epoch = json.loads(harness.cli("host", "status", "--json").stdout)["epoch"]
    run_id = harness.start_run("steps")
    old_worker = harness.wait_for_pid("b.pid")
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert psutil.pid_exists(old_worker)  # its own process group outlived the host

    harness.start_host()
    status = json.loads(harness.cli("host", "status", "--json").stdout)
    assert status["epoch"] == first_epoch + 1
    # The orphaned worker was reaped and the run resumed in a new worker.
    wait_until(lambda: process_gone(old_worker), what="the orphan worker to be reaped")
    harness.wait_for_pid("b.pid", previous=old_worker)
    (harness.project / "release-b").touch()
    assert harness.wait_for_status(run_id, "completed")["finalOutput"] == {"sum": 3}
    wait_until(
        lambda: [w[1] for w in harness.workers(run_id)] == ["orphaned", "exited"],
        what="the worker records",
    )
    assert (harness.project / "trace").read_text().split() == ["a", "b", "b", "c"]


@pytest.mark.integration
@pytest.mark.scenario("3.21")
def test_clean_stop_parks_a_running_run_and_the_next_host_finishes_it(harness: HostHarness):
    harness.write_workflow("steps", STEPS)
    first = harness.start_host()
    run_id = harness.start_run("steps")
    worker = harness.wait_for_pid("b.pid")
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=20) == 0
    assert process_gone(worker)
    rows = harness.query("SELECT status FROM run_queue WHERE run_id = ?", run_id)
    assert rows == [("parked",)]
    harness.start_host()
    (harness.project / "release-b").touch()
    assert harness.wait_for_status(run_id, "completed")["status"] == "completed"


@pytest.mark.integration
def test_runs_still_complete_after_the_worker_fork_server_dies(harness: HostHarness):
    host = harness.start_host()
    first = harness.start_run("hello", {"name": "one"})
    harness.wait_for_status(first, "completed")
    (zygote,) = _fork_servers(host)
    zygote.kill()
    second = harness.start_run("hello", {"name": "two"})
    status = harness.wait_for_status(second, "completed")
    assert status["finalOutput"] == {"greeting": "Hello, two!"}
    # A new fork server replaces the dead one.
    wait_until(
        lambda: [c for c in _fork_servers(host) if c.pid != zygote.pid], what="a new fork server"
    )


def _fork_servers(host: subprocess.Popen) -> list[psutil.Process]:
    """The host's live worker fork servers (`--zygote` children)."""
    return [c for c in psutil.Process(host.pid).children() if "--zygote" in _cmdline(c)]


def _cmdline(process: psutil.Process) -> str:
    """Its command line (one string: the fork server a host forked sets it as its title);
    none once it has exited (a killed fork server is a zombie until the host reaps it, and
    psutil refuses a zombie's command line)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def _live_children(zygote: psutil.Process) -> list[psutil.Process]:
    return [child for child in zygote.children() if not process_gone(child.pid)]


def _the_spare(zygote: psutil.Process) -> psutil.Process | None:
    """The fork server's one live child once no worker runs: the spare."""
    children = _live_children(zygote)
    return children[0] if len(children) == 1 else None


@pytest.mark.integration
def test_a_launch_is_run_by_the_spare_the_fork_server_forked_ahead(harness: HostHarness):
    harness.write_workflow("steps", STEPS)
    host = harness.start_host()
    # The first launch starts the fork server; the next one is run by its spare.
    first = harness.start_run("hello", {"name": "first"})
    assert harness.wait_for_status(first, "completed")["status"] == "completed"
    (zygote,) = _fork_servers(host)
    spare = wait_until(lambda: _the_spare(zygote), what="the fork server's spare")
    # Before any launch, it makes itself the leader of its own process group.
    wait_until(lambda: os.getpgid(spare.pid) == spare.pid, what="the spare's own group")
    # It starts the thread that will read its host's frames, so a launch need not.
    wait_until(lambda: spare.num_threads() == 2, what="the spare's reading thread")
    run_id = harness.start_run("steps")
    # The run's worker is that spare, and a new spare waits beside it.
    assert harness.wait_for_pid("b.pid") == spare.pid
    wait_until(lambda: len(_live_children(zygote)) == 2, what="the next spare")
    (harness.project / "release-b").touch()
    assert harness.wait_for_status(run_id, "completed")["status"] == "completed"
    # A spare that dies unused is not a worker exit: the next launch still runs.
    next_spare = wait_until(lambda: _the_spare(zygote), what="one spare again")
    assert next_spare.pid != spare.pid
    next_spare.kill()
    wait_until(lambda: process_gone(next_spare.pid), what="the killed spare to be reaped")
    again = harness.start_run("hello", {"name": "again"})
    assert harness.wait_for_status(again, "completed")["finalOutput"] == {
        "greeting": "Hello, again!"
    }
    # A spare whose fork server dies ends too (it never ran anything).
    last = wait_until(lambda: _the_spare(zygote), what="a spare after the direct fork")
    zygote.kill()
    wait_until(lambda: process_gone(last.pid), what="the orphaned spare to exit")


@pytest.mark.integration
def test_the_host_forks_its_fork_server_as_it_starts_and_the_first_launch_wakes_it(
    harness: HostHarness,
):
    host = harness.start_host()
    assert harness.cli("run", "list").returncode == 0
    wait_until(lambda: "ready at epoch" in harness.host_log(), what="the host's start to end")
    # Before any launch the host keeps one fork server-to-be, forked as it started: in its
    # own process group, with no spare yet, and none of the host's descriptors (database,
    # socket, lock, log file) but stderr and its own control socket.
    (standby,) = _fork_servers(host)
    assert os.getpgid(standby.pid) == standby.pid
    assert not standby.children()
    targets = {
        int(fd): os.readlink(f"/proc/{standby.pid}/fd/{fd}")
        for fd in os.listdir(f"/proc/{standby.pid}/fd")
    }
    assert targets[0] == targets[1] == os.devnull
    assert [t.split(":")[0] for fd, t in targets.items() if fd > 2] == ["socket"]
    harness.write_workflow("steps", STEPS)
    run_id = harness.start_run("steps")
    worker = psutil.Process(harness.wait_for_pid("b.pid"))
    # That first worker was forked by that very process, now the fork server.
    assert _fork_servers(host) == [standby]
    assert worker.ppid() == standby.pid
    assert worker.cwd() == str(harness.project)
    (harness.project / "release-b").touch()
    assert harness.wait_for_status(run_id, "completed")["status"] == "completed"


@pytest.mark.integration
def test_a_host_forks_its_fork_server_before_it_imports_its_own_modules(harness: HostHarness):
    # A new interpreter, as `host start` runs one (not a fork of the test kit's launcher,
    # which imported the host already).
    harness.host_as_child = True
    host = harness.start_host()
    (standby,) = _fork_servers(host)
    harness.write_workflow("modules", WORKER_MODULES)
    run_id = harness.start_run("modules")
    # Its worker was forked by that fork server, and neither maps the host's modules: a
    # fork copies, and a worker's exit tears down, only what workers need.
    assert harness.wait_for_status(run_id, "completed")["finalOutput"] == {
        "hostImported": False,
        "parent": standby.pid,
    }


@pytest.mark.integration
@pytest.mark.parametrize("ending", ["host stop", "SIGKILL"])
def test_an_unused_fork_server_ends_with_its_host(harness: HostHarness, ending: str):
    host = harness.start_host()
    wait_until(lambda: "ready at epoch" in harness.host_log(), what="the host's start to end")
    (standby,) = _fork_servers(host)
    if ending == "host stop":
        assert harness.cli("host", "stop").returncode == 0
    else:
        host.kill()
    # It reads end-of-file from its host and exits (reaped by the host it had, or by init).
    wait_until(lambda: process_gone(standby.pid), what="the fork server to end")


@pytest.mark.integration
@pytest.mark.parametrize("spare_state", ["waiting", "stopped"])
def test_host_stop_returns_once_its_fork_server_and_spare_are_gone(
    harness: HostHarness, spare_state: str
):
    host = harness.start_host()
    run_id = harness.start_run("hello", {"name": "x"})
    assert harness.wait_for_status(run_id, "completed")["status"] == "completed"
    (zygote,) = _fork_servers(host)
    spare = wait_until(lambda: _the_spare(zygote), what="the fork server's spare")
    if spare_state == "stopped":
        spare.suspend()  # it cannot read the end of its socket: it must be killed
    assert harness.cli("host", "stop").returncode == 0
    # Nothing of the host is left to hold its log open (a home on a filesystem that is
    # remounted or unmounted right after the stop): not the fork server, not its spare.
    assert process_gone(zygote.pid)
    assert process_gone(spare.pid)


@pytest.mark.integration
def test_a_fork_server_killed_before_the_first_launch_is_replaced(harness: HostHarness):
    host = harness.start_host()
    wait_until(lambda: "ready at epoch" in harness.host_log(), what="the host's start to end")
    (standby,) = _fork_servers(host)
    standby.kill()
    wait_until(lambda: not psutil.pid_exists(standby.pid), what="the host to reap it")
    harness.write_workflow("steps", STEPS)
    run_id = harness.start_run("steps")
    worker = psutil.Process(harness.wait_for_pid("b.pid"))
    (harness.project / "release-b").touch()
    assert harness.wait_for_status(run_id, "completed")["status"] == "completed"
    # The run went on (cold, or from a new fork server, which serves the next launches).
    (zygote,) = wait_until(lambda: _fork_servers(host), what="a new fork server")
    assert zygote.pid != standby.pid
    assert worker.pid != standby.pid
    again = harness.start_run("hello", {"name": "again"})
    assert harness.wait_for_status(again, "completed")["status"] == "completed"


# Holds the fork server's start (its workflow preload) until the file ZYGOTE_GO exists.
SLOW_FORK_SERVER_PLUGIN = """
import os
import sys
import time
from pathlib import Path

from pi_workflows import hookimpl


@hookimpl
def piw_register_workflows(register):
    deadline = time.monotonic() + 60
    while "--zygote" in sys.argv and not Path(os.environ["ZYGOTE_GO"]).exists():
        if time.monotonic() > deadline:
            raise RuntimeError("ZYGOTE_GO never appeared")
        time.sleep(0.02)
"""


@pytest.mark.integration
def test_a_launch_while_the_fork_server_starts_waits_for_it_instead_of_a_cold_start(
    harness: HostHarness,
):
    harness.write_workflow("steps", STEPS)
    harness.add_plugin("slow_fork_server", SLOW_FORK_SERVER_PLUGIN)
    go = harness.project / "zygote-go"
    host = harness.start_host(ZYGOTE_GO=str(go))
    run_id = harness.start_run("steps")  # its launch starts the fork server
    zygote = wait_until(lambda: _fork_servers(host), what="the fork server")[0]
    wait_until(lambda: harness.workers(run_id), what="the run's claim and its worker record")
    go.touch()  # the fork server finishes starting
    # The worker is a child of the fork server, not a cold interpreter the host spawned.
    worker = psutil.Process(harness.wait_for_pid("b.pid"))
    assert worker.ppid() == zygote.pid
    (harness.project / "release-b").touch()
    assert harness.wait_for_status(run_id, "completed")["status"] == "completed"


@pytest.mark.integration
def test_a_stopped_fork_server_is_replaced_and_launches_do_not_wait_for_it(
    harness: HostHarness,
):
    host = harness.start_host()
    harness.wait_for_status(harness.start_run("hello", {"name": "one"}), "completed")
    (zygote,) = _fork_servers(host)
    zygote.suspend()  # SIGSTOP: alive, but it forks nothing
    try:
        asked_at = time.monotonic()
        second = harness.start_run("hello", {"name": "two"})
        status = harness.wait_for_status(second, "completed")
        # Before: the launch waited for the fork server's reply as long as it allows.
        assert time.monotonic() - asked_at < FORK_REPLY_TIMEOUT_S
        assert status["finalOutput"] == {"greeting": "Hello, two!"}
        wait_until(lambda: process_gone(zygote.pid), what="the stopped fork server to be killed")
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            zygote.resume()
    assert "replacing it" in harness.host_log()
    replacement = wait_until(
        lambda: [c for c in _fork_servers(host) if c.pid != zygote.pid], what="a new fork server"
    )
    assert replacement
    third = harness.start_run("hello", {"name": "three"})
    assert harness.wait_for_status(third, "completed")["finalOutput"] == {
        "greeting": "Hello, three!"
    }
