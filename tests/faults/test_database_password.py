"""The PostgreSQL password stays with the user who gave it (issue 30, item 4).

A real PostgreSQL cluster of the test's own asks for a password (scram-sha-256); the host
is started by a real CLI command's autostart, and another local user's view of it (its
command line, as `ps` shows) must not hold the password, nor may status, log or errors.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import psutil
import pytest

from pi_workflows.host.lock import live_lock_holder
from pi_workflows.testing import WorkflowHost, installed_entry_points, short_temp_dir
from tests.host.workflows import CHECKPOINTED

pytestmark = pytest.mark.integration


@pytest.fixture
def home(postgres_cluster) -> Iterator[WorkflowHost]:
    host = WorkflowHost(short_temp_dir(), entry_points=installed_entry_points())
    host.write_workflow("checkpointed", CHECKPOINTED)
    try:
        yield host
    finally:
        host.cleanup()


def _host_command_line(home: WorkflowHost) -> str:
    holder = live_lock_holder(home.home.lock_path)
    assert holder is not None, home.host_log()
    return " ".join(psutil.Process(holder["pid"]).cmdline())


def test_an_autostarted_host_keeps_the_url_password_off_its_command_line(home, postgres_cluster):
    server = postgres_cluster.server
    url = server.create_database()
    password = server.password
    assert password and password in url

    started = home.run_cli("--database", url, "run", "start", "checkpointed", "--wait")

    assert started.returncode == 0, started.stderr + home.host_log()
    assert password not in _host_command_line(home)
    status = home.run_cli("--database", url, "host", "status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["database"].startswith("postgresql://postgres:***@")
    text_status = home.run_cli("--database", url, "host", "status")
    assert password not in status.stdout + text_status.stdout + text_status.stderr
    workers = home.run_cli("--database", url, "state", "status", "--json")
    assert password not in workers.stdout + workers.stderr
    assert password not in home.host_log()
    envelopes = _envelopes(url)
    assert envelopes and not any(password in envelope for envelope in envelopes)


def _envelopes(url: str) -> list[str]:
    """The launch envelopes the host recorded for its workers, as stored."""
    import psycopg2

    connection = psycopg2.connect(url)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT b.content FROM run_workers w "
                "JOIN blobs b ON b.blob_hash = w.launch_envelope_hash"
            )
            return [bytes(row[0]).decode() for row in cursor.fetchall()]
    finally:
        connection.close()


@pytest.mark.parametrize("source", ["PGPASSWORD", "PGPASSFILE"])
def test_a_url_without_a_password_uses_postgresqls_own_password_sources(
    home, postgres_cluster, source
):
    server = postgres_cluster.server
    url_without_password = server.create_database().replace(f":{server.password}@", "@")
    if source == "PGPASSWORD":
        env = {"PGPASSWORD": server.password}
    else:
        password_file = home.root / "pgpass"
        password_file.write_text(f"{server.host}:{server.port}:*:{server.user}:{server.password}\n")
        os.chmod(password_file, 0o600)
        env = {"PGPASSFILE": str(password_file)}

    started = home.run_cli(
        "--database", url_without_password, "run", "start", "checkpointed", "--wait", env=env
    )

    assert started.returncode == 0, started.stderr + home.host_log()


def test_a_wrong_password_is_refused_in_one_line_that_does_not_repeat_it(home, postgres_cluster):
    server = postgres_cluster.server
    good = server.create_database()
    bad = good.replace(f":{server.password}@", ":not-the-password@")

    result = home.run_cli("--database", bad, "state", "status")

    assert result.returncode != 0
    assert "not-the-password" not in result.stdout + result.stderr
    assert "password authentication failed" in result.stderr
