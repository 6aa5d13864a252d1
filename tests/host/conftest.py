"""A real host process on a private short home (the test kit's), plus this suite's helpers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows.home import DATABASE_ENV
from pi_workflows.testing import WorkflowHost, installed_entry_points, short_temp_dir, wait_until
from pi_workflows.testing.host import FAST_TIMERS


class HostHarness(WorkflowHost):
    """The kit's host with the inspection helpers the host tests share.

    Unlike the kit's default, every installed entry-point plugin loads (the suite runs in
    a venv with this repository's plugin distributions installed, and tests rely on them).
    """

    start_host = WorkflowHost.start  # the names these tests grew up with

    @property
    def config(self) -> Path:
        return self.config_dir

    def wait_for_pid(self, filename: str, previous: int | None = None) -> int:
        """The worker pid a test workflow wrote to `<project>/<filename>` (a new one)."""
        path = self.project / filename

        def read() -> int | None:
            text = path.read_text() if path.exists() else ""
            return int(text) if text and int(text) != previous else None

        return wait_until(read, what=f"a worker pid in {filename}")

    def workers(self, run_id: str) -> list[tuple[int, str, int | None]]:
        return self.query(
            "SELECT generation, status, pid FROM run_workers WHERE run_id = ? ORDER BY generation",
            run_id,
        )


@pytest.fixture
def harness() -> Iterator[HostHarness]:
    harness = HostHarness(short_temp_dir(), entry_points=installed_entry_points())
    try:
        yield harness
    finally:
        harness.cleanup()


__all__ = ["DATABASE_ENV", "FAST_TIMERS", "HostHarness", "wait_until"]
