"""The socket server under connection floods: a cap, an idle timeout, a quiet bounded log."""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import subprocess
import sys
import time

import pytest

from tests.polling import wait_until

from .conftest import HostHarness


def _idle_connections(harness: HostHarness, count: int) -> list[socket.socket]:
    """`count` connections the host greeted (and so holds a slot for) that stay silent."""
    greeted: list[socket.socket] = []
    while len(greeted) < count:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(harness.home.socket_path))
        first = json.loads(sock.makefile("rb").readline())
        if first["type"] == "hello":
            greeted.append(sock)
        else:  # a slot another client was still giving back
            sock.close()
    return greeted


def _closed_by_host(sock: socket.socket) -> bool:
    sock.settimeout(10)
    with contextlib.suppress(OSError):
        while sock.recv(65536):
            pass
    return True


def _served_status(harness: HostHarness) -> dict:
    result = wait_until(
        lambda: (r := harness.cli("host", "status", "--json", check=False)).returncode == 0 and r,
        what="host status to be served",
    )
    return json.loads(result.stdout)


def test_connections_over_the_cap_are_told_and_idle_ones_are_dropped(harness: HostHarness):
    harness.start_host(PI_WORKFLOWS_MAX_CONNECTIONS="4", PI_WORKFLOWS_IDLE_CONNECTION_S="5")
    idle = _idle_connections(harness, 4)
    try:
        refused = harness.cli("host", "status", check=False)
        assert refused.returncode == 1, harness.host_log()
        assert "too many connections (limit 4)" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        # Connections that never send a request are closed after the idle timeout...
        assert all(_closed_by_host(sock) for sock in idle)
    finally:
        for sock in idle:
            sock.close()
    # ...and their slots serve the next clients.
    assert _served_status(harness)["state"] == "running"


def test_a_connection_that_dribbles_a_partial_frame_is_dropped_at_the_idle_timeout(
    harness: HostHarness,
):
    harness.start_host(PI_WORKFLOWS_IDLE_CONNECTION_S="2")
    [sock] = _idle_connections(harness, 1)
    sock.settimeout(0.3)  # one byte of a frame that never ends, about every 0.3 s
    began = time.monotonic()
    closed = False
    try:
        while not closed and time.monotonic() - began < 15:
            try:
                sock.sendall(b"{")
                closed = sock.recv(1) == b""
            except TimeoutError:
                continue
            except OSError:  # reset or broken pipe: the host closed it
                closed = True
    finally:
        sock.close()
    # Each byte must not start the wait for the first frame again.
    assert closed and time.monotonic() - began < 10


def _connect_when_the_backlog_has_room(path: str) -> socket.socket:
    """A flooding client retries a connection the kernel refused because the host's
    listen backlog was full for a moment (the host still accepts and refuses the rest)."""

    def attempt() -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except ConnectionRefusedError:
            sock.close()
            return None
        return sock

    return wait_until(attempt, timeout=10, what="room in the host's listen backlog")


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


@pytest.mark.integration
def test_a_flood_under_a_low_fd_limit_keeps_the_host_and_its_log_healthy(harness: HostHarness):
    log = open(harness.root / "host.log", "ab")
    host = subprocess.Popen(
        [sys.executable, "-m", "pi_workflows", "host", "run"],
        env=harness.env,
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        cwd=harness.project,
        preexec_fn=_low_fd_limit,
    )
    log.close()
    harness.host_process = host
    wait_until(harness.home.socket_path.exists, what="the host socket")
    flood = []
    try:
        for _ in range(250):
            flood.append(_connect_when_the_backlog_has_room(str(harness.home.socket_path)))
        refused = harness.cli("host", "status", check=False)
        assert "too many connections" in refused.stderr
    finally:
        for sock in flood:
            sock.close()
    assert _served_status(harness)["state"] == "running"
    assert host.poll() is None
    text = harness.host_log()
    assert "Traceback" not in text
    assert len(text) < 16 * 1024, text[-2000:]


@pytest.mark.integration
def test_the_background_host_log_is_size_capped(harness: HostHarness):
    harness.cli("host", "start", PI_WORKFLOWS_HOST_LOG_MAX_BYTES="1024")
    for _ in range(40):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(harness.home.socket_path))
        sock.sendall(b"{not json}\n")  # each one is logged (rate-limited) and closed
        _closed_by_host(sock)
        sock.close()
    harness.cli("host", "stop")
    logs = harness.home.logs_dir
    assert (logs / "host.log").stat().st_size <= 1024
    assert (logs / "host.log.1").exists()
    assert sum(p.stat().st_size for p in logs.iterdir()) <= 3 * 1024
