"""A home on a read-only filesystem gets one line about it (issue 30, item 2).

The home lives on a real tmpfs, remounted read-only after a host used it; commands that
need to write there (starting a host, by hand or on demand) say what is wrong and what to
do, in one line, and change nothing.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows.testing import WorkflowHome
from tests.conftest import mounted_tmpfs

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
]


@pytest.fixture
def mount_point() -> Iterator[Path]:
    """An 8 MiB tmpfs, writable until the test remounts it."""
    with mounted_tmpfs() as point:
        yield point


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: "), result.stderr
    return result.stderr


def test_a_read_only_home_is_refused_in_one_line_that_names_the_filesystem(mount_point):
    (mount_point / "r").mkdir(mode=0o700)
    home = WorkflowHome(mount_point / "r")
    started = home.run_cli("run", "start", "hello", "--input-json", '{"name": "x"}', "--wait")
    assert started.returncode == 0, started.stderr
    assert home.run_cli("host", "stop").returncode == 0
    files_before = sorted(str(p) for p in home.home.root.rglob("*"))
    # `host stop` returns once every process of the host is gone (its fork server and
    # that one's spare held the host log open until then): the remount is not busy.
    remount = subprocess.run(
        ["mount", "-o", "remount,ro", str(mount_point)], capture_output=True, text=True
    )
    assert remount.returncode == 0, remount.stderr

    for command in (["host", "start"], ["run", "list"], ["run", "start", "hello"]):
        error = _one_line_error(home.run_cli(*command))
        assert "read-only filesystem" in error and "remount it read-write" in error, error
        assert "move it aside" not in error
    # A home still to be made there is refused the same way.
    fresh = home.run_cli("--home", str(mount_point / "new" / "h"), "host", "start")
    assert "read-only filesystem" in _one_line_error(fresh)
    assert sorted(str(p) for p in home.home.root.rglob("*")) == files_before
