"""A killed host never blocks the next one: zombies count as dead, clients start a new host."""

from __future__ import annotations

import json
import signal

import psutil
import pytest

from .conftest import HostHarness, wait_until


@pytest.mark.integration
def test_an_unreaped_killed_host_does_not_block_the_next_client(harness: HostHarness):
    harness.host_as_child = True  # this process's own child, so that it can stay unreaped
    first = harness.start_host()
    first.send_signal(signal.SIGKILL)
    # Not reaped: the killed host stays a zombie holding its pid and start time.
    wait_until(
        lambda: psutil.Process(first.pid).status() == psutil.STATUS_ZOMBIE,
        what="the killed host to become a zombie",
    )

    # The first client command after the kill starts a new host and succeeds.
    result = harness.cli("run", "start", "hello", "--wait", check=False)
    assert result.returncode == 0, result.stderr + harness.host_log()
    assert "Hello, world!" in result.stdout
    status = json.loads(harness.cli("host", "status", "--json").stdout)
    assert status["state"] == "running"
    first.wait()
    harness.cli("host", "stop")


@pytest.mark.integration
def test_every_first_command_after_a_host_kill_starts_a_new_host(harness: HostHarness):
    for _ in range(2):
        harness.cli("host", "start")
        holder = json.loads(harness.home.lock_path.read_text())
        process = psutil.Process(holder["pid"])
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        result = harness.cli("run", "start", "hello", "--wait", check=False)
        assert result.returncode == 0, result.stderr
        assert "Hello, world!" in result.stdout
    harness.cli("host", "stop")
