"""`run watch` and `run start --wait` follow a 3-node run through a real host and worker:
plain lines when piped, a spinner on a pseudo-terminal."""

from __future__ import annotations

import collections
import functools
import os
import pty
import re
import socket
import subprocess
import sys
import threading

import pytest

from pi_workflows.cli.progress_display import CLEAR_LINE, SPINNER
from pi_workflows.client.connection import HostConnection
from pi_workflows.client.session_client import SessionConnection
from pi_workflows.client.start_request import start_payload
from pi_workflows.errors import HostBusyError, RunWaitTimedOut
from pi_workflows.host import run_watch
from pi_workflows.protocol.framing import encode_frame
from pi_workflows.protocol.worker_messages import WorkerOperation
from pi_workflows.storage.models import Run

from .conftest import HostHarness, InProcessHarness, wait_until
from .workflows import WATCHED

ATTEMPT_LINE = r"{node}  attempt 1  ok  \d\d:\d\d:\d\d → \d\d:\d\d:\d\d  \d+ ms"
UPDATE_LINE = 'b  update progress/b  {"done":1}'


def _cli(harness: HostHarness, *args: str, **streams) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pi_workflows", *args],
        env=harness.env,
        stdin=subprocess.DEVNULL,
        cwd=harness.project,
        **streams,
    )


class TerminalReader:
    """The master side of a pseudo-terminal, drained by a thread so the child never blocks."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self.chunks: list[bytes] = []
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # the child closed the terminal
                return
            if not chunk:
                return
            self.chunks.append(chunk)

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", "replace")

    def close(self) -> str:
        os.close(self.slave)
        self.thread.join(timeout=10)
        os.close(self.master)
        return self.text()


def _assert_progress_lines(text: str, run_id: str) -> None:
    lines = [line for line in text.replace(CLEAR_LINE, "\n").splitlines() if line.strip()]
    lines = [line for line in lines if line[0] not in SPINNER]
    expected = [
        ATTEMPT_LINE.format(node="a"),
        re.escape(UPDATE_LINE),
        ATTEMPT_LINE.format(node="b"),
        ATTEMPT_LINE.format(node="c"),
        re.escape(f"{run_id}: completed at ") + ".*",
    ]
    progress = [line for line in lines if not line.startswith(f"{run_id}: queued")]
    assert len(progress) == len(expected), lines
    for line, pattern in zip(progress, expected, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)


def test_run_watch_prints_plain_lines_when_piped(harness: HostHarness):
    harness.write_workflow("watched", WATCHED)
    harness.start_host()
    run_id = harness.start_run("watched")
    watcher = _cli(harness, "run", "watch", run_id, stdout=subprocess.PIPE, text=True)
    wait_until(
        lambda: any(u for u in harness.query("SELECT 1 FROM workflow_updates")),
        what="the published update",
    )
    gave_up = harness.cli("run", "watch", run_id, "--timeout", "1", check=False)
    assert gave_up.returncode == 1 and "Traceback" not in gave_up.stderr
    assert f"Run {run_id} did not settle within 1 s" in gave_up.stderr
    (harness.project / "release-b").touch()
    output, _ = watcher.communicate(timeout=60)
    assert watcher.returncode == 0
    assert "\x1b" not in output and "\r" not in output
    _assert_progress_lines(output, run_id)


def test_run_watch_shows_a_spinner_on_a_terminal(harness: HostHarness):
    harness.write_workflow("watched", WATCHED)
    harness.start_host()
    run_id = harness.start_run("watched")
    terminal = TerminalReader()
    watcher = _cli(harness, "run", "watch", run_id, stdout=terminal.slave, stderr=terminal.slave)
    wait_until(lambda: "b running" in terminal.text(), what="the spinner on node b")
    (harness.project / "release-b").touch()
    assert watcher.wait(timeout=60) == 0
    output = terminal.close()
    assert CLEAR_LINE in output and any(frame in output for frame in SPINNER)
    _assert_progress_lines(output, run_id)


def test_run_start_wait_shows_progress_on_a_terminal(harness: HostHarness):
    harness.write_workflow("watched", WATCHED)
    harness.start_host()
    terminal = TerminalReader()
    starter = _cli(
        harness,
        "run",
        "start",
        "watched",
        "--wait",
        "--no-autostart",
        stdout=subprocess.PIPE,
        stderr=terminal.slave,
        text=True,
    )
    wait_until(lambda: "b running" in terminal.text(), what="the spinner on node b")
    (harness.project / "release-b").touch()
    stdout, _ = starter.communicate(timeout=60)
    assert starter.returncode == 0
    run_id = stdout.split(":")[0]
    assert stdout.startswith(f"{run_id}: completed\n") and '"sum": 3' in stdout
    _assert_progress_lines(terminal.close(), run_id)


def test_runs_watch_pushes_every_run_whose_state_moved(harness: HostHarness):
    harness.start_host()
    connection = SessionConnection(harness.home.socket_path)
    try:
        reply = connection.request("view.runs.watch", {"subscriptionId": "all-runs"})
        assert reply.outcome == "accepted"
        unknown = connection.request("view.run.watch", {"subscriptionId": "x"}, run_id="nope")
        assert unknown.outcome == "notFound"
        run_id = harness.start_run("hello")
        bad = connection.request(
            "view.run.watch", {"subscriptionId": "x", "afterRevision": -1}, run_id=run_id
        )
        assert bad.outcome == "rejected" and "afterRevision" in bad.error
        seen: list[str] = []

        def completed() -> bool:
            event = connection.next_event(0.5)
            if event is not None and event["event"] == "runs_changed":
                assert event["subscriptionId"] == "all-runs"
                seen.extend(r["status"] for r in event["payload"]["runs"] if r["runId"] == run_id)
            return "completed" in seen

        wait_until(completed, what="the run to be pushed as completed")
        assert seen[0] in ("queued", "running")
        reply = connection.request("view.unwatch", {"subscriptionId": "all-runs"})
        assert reply.outcome == "accepted"
    finally:
        connection.close()


@pytest.mark.integration
@pytest.mark.scenario("1.11")
def test_run_watch_follows_the_run_across_a_host_restart(harness: HostHarness):
    harness.write_workflow("watched", WATCHED)
    harness.start_host()
    run_id = harness.start_run("watched")
    watcher = _cli(
        harness, "--no-autostart", "run", "watch", run_id, stdout=subprocess.PIPE, text=True
    )
    wait_until(lambda: harness.query("SELECT 1 FROM workflow_updates"), what="the published update")
    harness.stop()  # parks the run mid-node; the watcher waits for a host to come back
    harness.start_host()
    (harness.project / "release-b").touch()
    output, _ = watcher.communicate(timeout=90)
    assert watcher.returncode == 0, output
    lines = output.splitlines()
    ended = [line.split("  ")[:3] for line in lines if "  attempt " in line]
    # Every ended attempt is shown once: b's interrupted attempt never ended.
    assert ended == [["a", "attempt 1", "ok"], ["b", "attempt 2", "ok"], ["c", "attempt 1", "ok"]]
    assert lines[-1].startswith(f"{run_id}: completed at ")


class VanishingHost:
    """A stand-in on the home's socket for a host that stops between greeting a client
    and answering its request: it greets with the real host's hello, reads one line and
    hangs up."""

    def __init__(self, socket_path: os.PathLike[str], hello: dict) -> None:
        self.socket_path = socket_path
        self.hello = encode_frame(hello)
        self.requests: list[bytes] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(os.fspath(socket_path))
        os.chmod(socket_path, 0o600)
        self.server.listen()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:  # closed: the stand-in is gone
                return
            with connection:
                connection.sendall(self.hello)
                line = connection.makefile("rb").readline()
                if line:  # a probe hangs up after the hello; a request comes as a line
                    self.requests.append(line)

    def close(self) -> None:
        self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        os.unlink(self.socket_path)
        self.thread.join(timeout=10)


@pytest.mark.integration
def test_run_watch_subscribes_again_when_a_host_stops_before_answering_it(harness: HostHarness):
    """A restart that crosses the subscription (the host accepts the watcher, then stops
    before it answers) is waited out like a host that is down; `run watch` does not fail."""
    run_id = _watched_run(harness)
    greeting = HostConnection(harness.home.socket_path)
    greeting.close()
    harness.stop()
    vanishing = VanishingHost(harness.home.socket_path, greeting.hello)
    try:
        watcher = _cli(
            harness,
            "--no-autostart",
            "run",
            "watch",
            run_id,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_until(lambda: vanishing.requests, what="the watcher's subscription")
        assert b"view.run.watch" in vanishing.requests[0]
    finally:
        vanishing.close()
    harness.start_host()
    (harness.project / "release-b").touch()
    output, _ = watcher.communicate(timeout=90)
    assert watcher.returncode == 0, output
    assert output.splitlines()[-1].startswith(f"{run_id}: completed at ")


def test_a_status_watch_pushes_the_run_status_object_each_time_it_changes(harness: HostHarness):
    run_id = _watched_run(harness)
    connection = SessionConnection(harness.home.socket_path)
    try:
        bad = connection.request(
            "view.run.watch", {"subscriptionId": "s", "statusOnly": "yes"}, run_id=run_id
        )
        assert bad.outcome == "rejected" and "statusOnly" in bad.error
        reply = connection.request(
            "view.run.watch", {"subscriptionId": "s", "statusOnly": True}, run_id=run_id
        )
        assert reply.outcome == "accepted"
        pushed: list[dict] = []

        def pushed_until(status: str) -> bool:
            event = connection.next_event(0.5)
            if event is not None:
                assert (event["event"], event["subscriptionId"]) == ("run_status", "s")
                pushed.append(event["payload"])
            return bool(pushed) and pushed[-1]["status"] == status

        wait_until(lambda: pushed_until("running"), what="the running status pushed")
        (harness.project / "release-b").touch()
        wait_until(lambda: pushed_until("completed"), what="the completed status pushed")
        client = harness.client()
        try:
            # The whole run.status object, each one different from the one before.
            assert pushed[-1] == client.run_status(run_id)
        finally:
            client.close()
        assert all(a != b for a, b in zip(pushed, pushed[1:], strict=False))
        assert [p["revision"] for p in pushed] == sorted(p["revision"] for p in pushed)
    finally:
        connection.close()


def test_a_status_watch_reads_its_run_once_for_its_request_and_its_first_push(
    harness: HostHarness, monkeypatch: pytest.MonkeyPatch
):
    """The read that refuses an unknown run is also a status watch's first push, unless
    a commit came in between."""
    assert isinstance(harness, InProcessHarness)  # the host's functions can be counted
    reads: list[str] = []
    for name in ("get_run", "run_status"):
        read = getattr(run_watch, name)
        monkeypatch.setattr(run_watch, name, functools.partial(_counted, reads, read))
    run_id = _watched_run(harness)
    wait_until(lambda: harness.query("SELECT 1 FROM workflow_updates"), what="the run at b")
    commits = harness.host.store.commits
    connection = SessionConnection(harness.home.socket_path)
    try:
        unknown = connection.request(
            "view.run.watch", {"subscriptionId": "u", "statusOnly": True}, run_id="run-none"
        )
        assert unknown.outcome == "notFound"
        reads.clear()
        watched = {"subscriptionId": "s", "statusOnly": True}
        assert connection.request("view.run.watch", watched, run_id=run_id).ok
        event = wait_until(lambda: connection.next_event(0.1), what="the first push")
        assert event["payload"]["status"] == "running"
        # One read; a commit before the push (a heartbeat's, say) makes it read again.
        assert set(reads) == {run_id}
        assert len(reads) <= 1 + (harness.host.store.commits - commits)
    finally:
        connection.close()
        (harness.project / "release-b").touch()
    assert harness.wait_for_status(run_id, "completed")["status"] == "completed"


def _counted(reads: list[str], read, run_id: str):
    reads.append(run_id)
    return read(run_id)


def _watched_run(harness: HostHarness) -> str:
    """A run of WATCHED on a started host; its node b runs until release-b exists."""
    harness.write_workflow("watched", WATCHED)
    harness.start_host()
    return harness.start_run("watched")


def test_wait_for_run_returns_on_the_pushed_status_not_on_a_poll(harness: HostHarness):
    run_id = _watched_run(harness)
    client = harness.client()
    seen: list[str] = []
    waited: list[dict] = []
    # A poll interval of an hour: only a pushed status can end this wait in time.
    waiter = threading.Thread(
        target=lambda: waited.append(
            client.wait_for_run(run_id, on_progress=lambda s: seen.append(s["status"]), poll_s=3600)
        ),
        daemon=True,
    )
    try:
        waiter.start()
        wait_until(lambda: "running" in seen, what="the wait to see the run running")
        (harness.project / "release-b").touch()
        waiter.join(timeout=60)
        assert not waiter.is_alive(), "wait_for_run did not return on the pushed status"
        assert waited[0]["status"] == "completed" and waited[0]["finalOutput"] == {"sum": 3}
        assert waited[0] == client.run_status(run_id)
        # Its subscription ended: the host pushes nothing more on the watch connection.
        assert client._watch is not None and client._watch.next_event(0.3) is None
    finally:
        client.close()


def test_waits_on_one_kept_connection_leave_the_host_one_close_callback(harness: HostHarness):
    # A client keeps its watch connection for its next wait; each wait subscribes and
    # unsubscribes on it. The host grew a close callback per wait (found by the 100k-run
    # retention soak as memory growing with the runs).
    run_id = _watched_run(harness)
    (harness.project / "release-b").touch()
    client = harness.client()
    host = harness.host
    assert host is not None, "this test reads the in-process host's connections"

    def callbacks() -> int:
        return sum(len(connection._on_close) for connection in host.server.connections)

    try:
        assert client.wait_for_run(run_id)["status"] == "completed"
        after_one = callbacks()
        for _ in range(20):
            assert client.wait_for_run(run_id)["status"] == "completed"
        assert callbacks() == after_one
    finally:
        client.close()


def test_wait_for_run_times_out_with_the_last_status(harness: HostHarness):
    run_id = _watched_run(harness)
    harness.wait_for_status(run_id, "running")  # the status the timeout must report
    client = harness.client()
    try:
        with pytest.raises(RunWaitTimedOut, match=f"Run {run_id} is still running after"):
            client.wait_for_run(run_id, until=lambda s: False, timeout_s=0.5)
        (harness.project / "release-b").touch()
        assert client.wait_for_run(run_id)["status"] == "completed"
    finally:
        client.close()


def test_wait_for_run_polls_when_the_host_has_no_room_for_a_watch(harness: HostHarness):
    harness.start_host(PI_WORKFLOWS_MAX_CONNECTIONS="1")
    client = harness.client()

    def started() -> str | None:
        try:
            return client.start_run(start_payload("hello", harness.project, None))["runId"]
        except HostBusyError:  # the harness's probe has not let go of the one slot yet
            return None  # the client has no connection yet: the next try opens one

    try:
        run_id = wait_until(started, what="the one connection the host takes")
        # The client's one connection is the host's only one: the watch is refused.
        assert client.wait_for_run(run_id, poll_s=0.01)["status"] == "completed"
        assert client._watch is None
    finally:
        client.close()


class StatusReads:
    """A status watch on a `WATCHED` run held at b, with the host's status reads of each
    run and its poll timer's publishes counted from here on."""

    def __init__(self, harness: HostHarness, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: collections.Counter[str] = collections.Counter()
        self.polls = 0
        read, poll = run_watch.run_status, run_watch.RunWatches.piwh_poll

        def counted_read(run_id: str) -> dict:
            self.reads[run_id] += 1
            return read(run_id)

        @functools.wraps(poll)
        def counted_poll(watches) -> None:
            self.polls += 1
            poll(watches)

        monkeypatch.setattr(run_watch, "run_status", counted_read)
        monkeypatch.setattr(run_watch.RunWatches, "piwh_poll", counted_poll)
        harness.write_workflow("watched", WATCHED)
        harness.start_host()
        self.held = harness.start_run("watched")
        wait_until(lambda: harness.query("SELECT 1 FROM workflow_updates"), what="the run at b")
        self.watch = SessionConnection(harness.home.socket_path)
        subscription = {"subscriptionId": "held", "statusOnly": True}
        assert self.watch.request("view.run.watch", subscription, run_id=self.held).ok
        wait_until(lambda: self.watch.next_event(0.1), what="the held run's status")
        self._reads_before, self._polls_before = self.reads[self.held], self.polls

    def of_held_run(self) -> int:
        """The held run's status reads since the watch's first push."""
        return self.reads[self.held] - self._reads_before

    def poll_publishes(self) -> int:
        return self.polls - self._polls_before


def test_a_status_watch_reads_its_run_again_only_when_that_run_changed(
    harness: HostHarness, monkeypatch: pytest.MonkeyPatch
):
    """Other runs' writes do not read the watched run's status again; their stops and the
    poll timer still do (a pause, say, shows there)."""
    assert isinstance(harness, InProcessHarness)  # the host's functions can be counted
    counted = StatusReads(harness, monkeypatch)
    try:
        others = [harness.start_run("hello", {"name": str(number)}) for number in range(10)]
        for run_id in others:
            assert harness.wait_for_status(run_id, "completed")["status"] == "completed"
        # Each other run wrote twice or more and stopped once: only its stop read it.
        assert counted.of_held_run() <= counted.poll_publishes() + len(others) + 1
    finally:
        counted.watch.close()
        (harness.project / "release-b").touch()
    assert harness.wait_for_status(counted.held, "completed")["status"] == "completed"


def test_a_status_watch_is_pushed_the_status_its_runs_commit_read_on_postgresql(
    harness: HostHarness, backend: str, monkeypatch: pytest.MonkeyPatch
):
    """On PostgreSQL the commit of a write to a run a status watch follows carries the
    read of that run's status (`StateStore.read_with_commit`): the watch is pushed what
    the commit left, with no read of its own. SQLite reads it in the process."""
    assert isinstance(harness, InProcessHarness)  # the host's functions can be counted
    counted = StatusReads(harness, monkeypatch)
    held, watch = counted.held, counted.watch
    try:
        (harness.project / "release-b").touch()
        pushed: list[dict] = []

        def completed() -> bool:
            event = watch.next_event(0.1)
            if event is not None:
                pushed.append(event["payload"])
            return bool(pushed) and pushed[-1]["status"] == "completed"

        wait_until(completed, what="the completed status pushed")
        assert len(pushed) >= 2  # b's end, c's start and end: pushed as they committed
    finally:
        watch.close()
    assert pushed[-1] == harness.wait_for_status(held, "completed")
    assert pushed[-1]["finalOutput"] == {"sum": 3}
    if backend == "postgresql":
        # Its writes' publishes read nothing (each read 3 times for 2 pushes without the
        # read behind the commit); a poll timer's publish reads it, and so may the
        # publish of its stop, which can come after the worker's exit was committed.
        assert counted.of_held_run() <= counted.poll_publishes() + 1
    else:
        assert counted.of_held_run() >= len(pushed)


def test_a_status_read_behind_a_commit_is_not_pushed_once_another_commit_came_after_it(
    harness: HostHarness, monkeypatch: pytest.MonkeyPatch
):
    """A commit between a write's commit and the publish that follows it outdates the
    status read behind that write's commit: the watch is pushed the status read again."""
    assert isinstance(harness, InProcessHarness)  # the host's functions are wrapped
    released: list[str] = []
    handled = run_watch.RunWatches.piwh_worker_operation

    @functools.wraps(handled)
    def then_another_commit(self, operation, run_id, payload, result) -> None:
        handled(self, operation, run_id, payload, result)
        # The first snapshot written after the release, once.
        if released == [run_id] and operation == WorkerOperation.WRITE_SNAPSHOT:
            released.append("done")
            store = self.services.store

            def change_the_run() -> None:
                with store.transaction():
                    Run.update(status_detail="written after that commit").where(
                        Run.run_id == run_id
                    ).execute()

            store.after_commit(change_the_run)

    monkeypatch.setattr(run_watch.RunWatches, "piwh_worker_operation", then_another_commit)
    counted = StatusReads(harness, monkeypatch)
    pushed: list[dict] = []
    try:
        released.append(counted.held)
        (harness.project / "release-b").touch()

        def completed() -> bool:
            event = counted.watch.next_event(0.1)
            if event is not None:
                pushed.append(event["payload"])
            return bool(pushed) and pushed[-1]["status"] == "completed"

        wait_until(completed, what="the completed status pushed")
    finally:
        counted.watch.close()
    assert released[-1] == "done"
    # The worker's next write sets the detail again: only a read in between saw it.
    assert "written after that commit" in [status["statusDetail"] for status in pushed]
