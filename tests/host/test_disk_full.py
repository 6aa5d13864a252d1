"""A full disk under the state database: clients hear "disk full" and where, the host lives."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows.testing import installed_entry_points, wait_until
from tests.conftest import mounted_tmpfs

from .conftest import HostHarness
from .workflows import STEPS


@pytest.fixture
def small_disk_harness() -> Iterator[HostHarness]:
    """A host whose whole root (home, project, log) lives on an 8 MiB tmpfs."""
    with mounted_tmpfs() as mount_point:
        (mount_point / "r").mkdir(mode=0o700)
        harness = HostHarness(mount_point / "r", entry_points=installed_entry_points())
        try:
            yield harness
        finally:
            harness.cleanup()


def _fill(path: Path) -> None:
    """Write `path` until the filesystem has no room left."""
    chunk = b"\0" * 65536
    # Unbuffered: a buffered file keeps what the full disk refused and raises ENOSPC again
    # when it is closed (so the test failed at the end of this block, now and then).
    with open(path, "wb", buffering=0) as handle:
        while True:
            try:
                handle.write(chunk)  # a partial write returns; the next one raises
            except OSError as error:
                assert error.errno == errno.ENOSPC
                return


@pytest.mark.integration
def test_a_full_disk_is_reported_as_such_and_the_host_survives(small_disk_harness: HostHarness):
    harness = small_disk_harness
    harness.start_host()
    harness.wait_for_status(harness.start_run("hello", {"name": "before"}), "completed")
    filler = harness.root / "filler"
    try:
        _fill(filler)
        result = harness.cli("run", "start", "hello", "--no-autostart", check=False)
        assert result.returncode == 1
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert "disk is full" in lines[0]
        assert str(harness.home.database_path) in lines[0]
        assert harness.host_process is not None and harness.host_process.poll() is None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(filler)
    run_id = harness.start_run("hello", {"name": "after"})
    assert harness.wait_for_status(run_id, "completed")["finalOutput"] == {
        "greeting": "Hello, after!"
    }


@pytest.mark.integration
def test_a_run_that_meets_a_full_disk_mid_node_goes_on_when_space_returns(
    small_disk_harness: HostHarness,
):
    harness = small_disk_harness
    harness.write_workflow("steps", STEPS)
    harness.start_host()
    run_id = harness.start_run("steps")
    harness.wait_for_pid("b.pid")
    filler = harness.root / "filler"
    try:
        _fill(filler)
        (harness.project / "release-b").touch()  # an inode, no blocks: tmpfs has room
        # Node b's result meets the full disk: the worker waits, nothing is written.
        wait_until(
            lambda: "is full: nothing more is written" in harness.host_log(),
            what="the host to meet the full disk",
        )
        assert harness.host_process is not None and harness.host_process.poll() is None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(filler)
    final = harness.wait_for_status(run_id, "completed", timeout=60)
    assert final["finalOutput"] == {"sum": 3}
    # The same worker went on once there was room: b ran once, its result was kept.
    assert (harness.project / "trace").read_text().split() == ["a", "b", "c"]
    assert len(harness.workers(run_id)) == 1
    assert "the disk has room again" in harness.host_log()
