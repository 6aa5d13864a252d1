"""The test kit keeps a test's state in memory when the machine has room for it
(`pi_workflows.testing.scratch`): the homes of `short_temp_dir` and the test PostgreSQL
servers' clusters. A disk made every cloned test database wait on writeback (420-440 ms
against 17 ms in memory; docs/performance.md)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from pi_workflows.testing import scratch, short_temp_dir
from pi_workflows.testing.postgres import PostgresServer
from tests.conftest import mounted_tmpfs


def test_a_memory_file_system_is_used_only_when_it_has_room(monkeypatch: pytest.MonkeyPatch):
    with mounted_tmpfs("3g") as roomy, mounted_tmpfs("64m") as small:
        monkeypatch.setattr(scratch, "MEMORY_DIR", str(roomy))
        assert scratch.memory_dir() == str(roomy)
        assert short_temp_dir().parent == roomy

        # A container's default /dev/shm is 64 MB: the system's temp dir instead.
        monkeypatch.setattr(scratch, "MEMORY_DIR", str(small))
        assert scratch.memory_dir() is None
        assert short_temp_dir().parent == Path(tempfile.gettempdir()).resolve()

    monkeypatch.setattr(scratch, "MEMORY_DIR", str(roomy))  # unmounted and removed
    assert scratch.memory_dir() is None


def test_the_test_postgresql_server_keeps_its_cluster_where_the_kit_keeps_homes(
    postgres_server: PostgresServer,
):
    [(data_directory,)] = postgres_server.execute("SHOW data_directory")
    expected = Path(scratch.memory_dir() or tempfile.gettempdir()).resolve()
    assert expected in Path(str(data_directory)).resolve().parents
