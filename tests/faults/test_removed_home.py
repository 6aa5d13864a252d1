"""A host whose home is removed under it stops (`rm -rf` of a home, a temporary home
deleted by a script): nothing can reach it or stop it through the home any more, and on
a shared database its runs would stay claimed for good."""

from __future__ import annotations

import shutil

import pytest

from pi_workflows.testing.host import WorkflowHost

pytestmark = pytest.mark.integration


def test_a_host_whose_home_is_removed_stops(workflow_host: WorkflowHost):
    process = workflow_host.start()

    shutil.rmtree(workflow_host.home.root)

    assert process.wait(timeout=30) == 0
    assert "no longer names this host" in workflow_host.host_log()


def test_a_host_whose_lock_file_names_another_host_stops(workflow_host: WorkflowHost):
    process = workflow_host.start()
    lock = workflow_host.home.lock_path
    lock.write_text(lock.read_text().replace('"hostId":"', '"hostId":"another-'))

    assert process.wait(timeout=30) == 0
    assert "no longer names this host" in workflow_host.host_log()
