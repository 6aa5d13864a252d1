"""A database of an older schema version: upgraded on open, or refused in one line (§15).

Each test builds the older layout for real (the current schema, then the SQL that turns
it back into the old one) on the test's backend, SQLite or PostgreSQL.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing

import pytest

from pi_workflows.clock import now_ms
from pi_workflows.errors import HostAlreadyRunningError, SchemaMismatchError
from pi_workflows.event_types import EventType
from pi_workflows.home import DATABASE_ENV, home_key
from pi_workflows.storage import SCHEMA_VERSION, open_state, put_json_in_parts, run_events
from pi_workflows.storage.models import Blob, Run, RunQueue
from pi_workflows.storage.retention import DAY_MS
from pi_workflows.storage.run_state import record_transcript
from pi_workflows.storage.schema_upgrade import RENAMED_EVENTS, TRANSCRIPT_INDEX
from pi_workflows.testing import WorkflowHost, short_temp_dir
from tests.conftest import create_test_run
from tests.host.workflows import WATCHED

# host_state as schema v2 had it before several hosts shared a database: one row, id 1.
V2_HOST_STATE = """
    CREATE TABLE host_state (
        id INTEGER NOT NULL PRIMARY KEY, epoch INTEGER NOT NULL, host_id TEXT,
        token_hash VARCHAR(64), pid INTEGER, process_start_identity TEXT,
        started_at BIGINT, heartbeat_at BIGINT, expires_at BIGINT)
"""


def _execute(database_url: str | None, home_env, *statements: str) -> list[tuple]:
    """Run SQL on the test's database outside pi-workflows; returns the last statement's rows."""
    if database_url is None:
        with closing(sqlite3.connect(home_env.home.database_path)) as connection:
            with connection:
                for statement in statements:
                    cursor = connection.execute(statement)
            return cursor.fetchall()
    import psycopg2

    with closing(psycopg2.connect(database_url)) as connection:
        with connection, connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
            return cursor.fetchall() if cursor.description else []


def _make_v2(database_url: str | None, home_env, host_row: str | None) -> None:
    """Turn a current database into schema v2 as it was before host_state per home."""
    open_state(home_env.home, database_url).close()
    statements = [
        "DROP TABLE nested_blobs",
        "DROP TABLE forwarded_commands",
        "DROP TABLE host_state",
        V2_HOST_STATE,
        "UPDATE schema_meta SET schema_version = 2",
    ]
    if host_row is not None:
        statements.append(f"INSERT INTO host_state VALUES ({host_row})")
    if database_url is not None:
        statements.append(
            "ALTER TABLE human_decisions ALTER COLUMN request_digest TYPE VARCHAR(64)"
        )
    _execute(database_url, home_env, *statements)


@pytest.fixture
def home_env(database_url) -> Iterator[WorkflowHost]:
    """A home whose host is not started yet, on the test's database."""
    host = WorkflowHost(short_temp_dir())
    if database_url is not None:
        host.env[DATABASE_ENV] = database_url
    try:
        yield host
    finally:
        host.cleanup()


def test_a_v2_database_is_upgraded_on_open_and_its_epochs_keep_growing(home_env, database_url):
    stopped_at = now_ms() - 60_000
    _make_v2(database_url, home_env, f"1, 7, NULL, NULL, NULL, NULL, 1, {stopped_at}, NULL")

    open_state(home_env.home, database_url).close()  # a writer opens it: the upgrade

    status = json.loads(home_env.run_cli("state", "status", "--json").stdout)
    assert (status["schemaVersion"], status["upgradeNeeded"]) == (SCHEMA_VERSION, False)
    rows = _execute(
        database_url, home_env, "SELECT epoch, home_key, host_id, released_at FROM host_state"
    )
    assert rows == [(7, home_key(home_env.home), None, stopped_at)]
    assert _execute(database_url, home_env, "SELECT COUNT(*) FROM forwarded_commands") == [(0,)]
    assert _execute(database_url, home_env, "SELECT COUNT(*) FROM nested_blobs") == [(0,)]
    if database_url is not None:
        assert _execute(
            database_url,
            home_env,
            "SELECT character_maximum_length FROM information_schema.columns "
            "WHERE table_name = 'human_decisions' AND column_name = 'request_digest'",
        ) == [(71,)]

    # The home's host takes its row over with the next epoch.
    home_env.start()
    hosts = json.loads(home_env.cli("host", "status", "--json").stdout)["hosts"]
    assert [host["epoch"] for host in hosts] == [8]
    assert _execute(database_url, home_env, "SELECT COUNT(*) FROM host_state") == [(1,)]


def test_a_v2_database_with_the_v3_tables_is_only_restamped(home_env, database_url):
    open_state(home_env.home, database_url).close()
    _execute(database_url, home_env, "UPDATE schema_meta SET schema_version = 2")
    tables_before = _execute(database_url, home_env, "SELECT COUNT(*) FROM host_state")

    open_state(home_env.home, database_url).close()

    assert _execute(database_url, home_env, "SELECT schema_version FROM schema_meta") == [
        (SCHEMA_VERSION,)
    ]
    assert _execute(database_url, home_env, "SELECT COUNT(*) FROM host_state") == tables_before


def test_a_v2_database_whose_old_host_is_live_is_refused_unchanged(home_env, database_url):
    expires = now_ms() + 60_000
    _make_v2(database_url, home_env, f"1, 4, 'old-host', 'x', 4242, 'i', 1, 1, {expires}")

    with pytest.raises(HostAlreadyRunningError) as refused:
        open_state(home_env.home, database_url)

    message = str(refused.value)
    assert "\n" not in message
    assert "older pi-workflows (PID 4242, epoch 4)" in message and "host stop" in message
    assert _execute(database_url, home_env, "SELECT schema_version FROM schema_meta") == [(2,)]
    assert _execute(database_url, home_env, "SELECT id, epoch FROM host_state") == [(1, 4)]
    # Looking is still possible: a read-only look does not upgrade.
    result = home_env.run_cli("state", "status")
    assert result.returncode == 0 and "v2 needs the upgrade" in result.stdout, result.stderr


@pytest.mark.parametrize(
    ("version", "says"),
    [
        (SCHEMA_VERSION + 1, "newer than this pi-workflows"),
        (1, "cannot upgrade"),
    ],
)
def test_a_version_without_an_upgrade_path_is_refused_in_one_line(
    home_env, database_url, version, says
):
    open_state(home_env.home, database_url).close()
    _execute(database_url, home_env, f"UPDATE schema_meta SET schema_version = {version}")

    with pytest.raises(SchemaMismatchError) as refused:
        open_state(home_env.home, database_url)

    message = str(refused.value)
    assert "\n" not in message and f"v{version}" in message and says in message
    if version < SCHEMA_VERSION:
        backup = "state backup" if database_url is None else "pg_dump"
        assert backup in message
    else:
        assert "upgrade pi-workflows" in message
    assert _execute(database_url, home_env, "SELECT schema_version FROM schema_meta") == [
        (version,)
    ]


def _sqlite_files(home_env) -> dict[str, bytes]:
    """The SQLite database and its WAL files, byte for byte."""
    path = home_env.home.database_path
    return {
        candidate.name: candidate.read_bytes()
        for candidate in (path, path.with_name(path.name + "-wal"))
        if candidate.exists()
    }


@pytest.mark.scenario("11.4")
def test_state_status_and_verify_only_read_an_older_database(home_env, database_url):
    """`state status|verify` open the database read-only and say an upgrade is needed
    instead of doing it (issue 22.6); the host's start does the upgrade."""
    _make_v2(database_url, home_env, None)
    before = _sqlite_files(home_env) if database_url is None else None

    status = home_env.run_cli("state", "status", "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert (shown["schemaVersion"], shown["upgradeNeeded"]) == (2, True)
    text = home_env.run_cli("state", "status").stdout
    assert f"v2 needs the upgrade to v{SCHEMA_VERSION}" in text
    assert "pi-workflows host start" in text
    verified = home_env.run_cli("state", "verify")
    assert verified.returncode == 1
    assert verified.stderr.strip() == (
        f"schema: v2 needs the upgrade to v{SCHEMA_VERSION}, which the next host does when it "
        "starts ('pi-workflows host start'); back it up first if you may go back"
    )

    assert _execute(database_url, home_env, "SELECT schema_version FROM schema_meta") == [(2,)]
    assert _execute(database_url, home_env, "SELECT COUNT(*) FROM host_state") == [(0,)]
    if before is not None:
        assert _sqlite_files(home_env) == before
        backup = home_env.root / "before-upgrade.sqlite"
        assert home_env.run_cli("state", "backup", str(backup)).returncode == 0
        with closing(sqlite3.connect(backup)) as copy:
            assert copy.execute("SELECT schema_version FROM schema_meta").fetchall() == [(2,)]

    home_env.start()
    upgraded = json.loads(home_env.cli("state", "status", "--json").stdout)
    assert (upgraded["schemaVersion"], upgraded["upgradeNeeded"]) == (SCHEMA_VERSION, False)


def _make_v3(database_url: str | None, home_env) -> None:
    """Turn a current database back into schema v3: the engine's events under the names
    v3 gave them, the partial indexes pruning read the nesting values through (the
    transcript one names the old type), and no `nested_blobs`."""
    back = " ".join(f"WHEN '{new}' THEN '{old}'" for old, new in RENAMED_EVENTS.items())
    _execute(
        database_url,
        home_env,
        f"UPDATE events SET event_type = CASE event_type {back} ELSE event_type END",
        "DROP TABLE nested_blobs",
        f"CREATE INDEX {TRANSCRIPT_INDEX} ON events (payload_hash) "
        "WHERE event_type = 'agent_transcript_recorded'",
        "CREATE INDEX blobs_split_values ON blobs (blob_hash)",
        "UPDATE schema_meta SET schema_version = 3",
    )


def _history(home_env, run_id: str) -> dict:
    """The run as its status, its events and a follower (the viewer, `run watch`) read it."""
    status = json.loads(home_env.cli("run", "status", run_id, "--json").stdout)
    watched = home_env.cli("run", "watch", run_id, "--json").stdout.splitlines()
    store = open_state(home_env.home, home_env.env.get(DATABASE_ENV), read_only=True)
    try:
        events = [(event.revision, event.event_type, event.actor) for event in run_events(run_id)]
    finally:
        store.close()
    return {
        "status": {key: status[key] for key in ("status", "finalOutput", "revision")},
        "progress": [entry for line in watched for entry in json.loads(line)["entries"]],
        "events": events,
    }


def _indexes_named(database_url: str | None, home_env, names: tuple[str, ...]) -> set[str]:
    listed = ", ".join(f"'{name}'" for name in names)
    catalog = (
        f"SELECT name FROM sqlite_master WHERE type = 'index' AND name IN ({listed})"
        if database_url is None
        else f"SELECT indexname FROM pg_indexes WHERE indexname IN ({listed})"
    )
    return {row[0] for row in _execute(database_url, home_env, catalog)}


# Partial indexes v3 and v4 databases had for pruning, which read the values nesting blobs.
OLD_NESTING_INDEXES = ("blobs_split_values", TRANSCRIPT_INDEX)


@pytest.mark.integration
def test_a_v3_database_with_the_old_event_names_reads_the_same_after_a_host_upgrades_it(
    home_env, database_url
):
    # a → b → c, b an action that publishes an update: every kind of event `run watch`
    # reads. Released at once: nothing follows it mid-way here.
    home_env.write_workflow("watched", WATCHED)
    (home_env.project / "release-b").touch()
    home_env.start()
    run_id = home_env.start_run("watched")
    home_env.wait_for_status(run_id, "completed")
    before = _history(home_env, run_id)
    home_env.stop()
    _make_v3(database_url, home_env)
    stored = {row[0] for row in _execute(database_url, home_env, "SELECT event_type FROM events")}
    assert {"run_started", "node_started", "update_published", "run_completed"} <= stored

    home_env.start()  # the real host opens the v3 database: the upgrade

    assert _execute(database_url, home_env, "SELECT schema_version FROM schema_meta") == [
        (SCHEMA_VERSION,)
    ]
    stored = {row[0] for row in _execute(database_url, home_env, "SELECT event_type FROM events")}
    assert stored <= set(EventType) and not stored & set(RENAMED_EVENTS)
    assert _history(home_env, run_id) == before
    assert [kind for _, kind, _ in before["events"]] == [
        EventType.RUN_CREATED,
        EventType.LEASE_CLAIMED,
        EventType.RUN_QUEUE_RUNNING,
        EventType.RUN_STARTED,
        EventType.NODE_STARTED,
        EventType.NODE_FINISHED,
        EventType.NODE_STARTED,
        EventType.EFFECT_RESERVED,
        EventType.UPDATE_PUBLISHED,
        EventType.EFFECT_SETTLED,
        EventType.NODE_FINISHED,
        EventType.NODE_STARTED,
        EventType.NODE_FINISHED,
        EventType.RUN_COMPLETED,
    ]
    kinds = [entry["kind"] for entry in before["progress"]]
    assert kinds.count("nodeStarted") == kinds.count("nodeEnded") == 3
    assert kinds.count("update") == 1
    assert [e["event"] for e in before["progress"] if e["kind"] == "run"] == [
        "run.started",
        "run.completed",
    ]
    # Through v4 to v5: the nesting values' indexes went, their table came.
    assert _indexes_named(database_url, home_env, OLD_NESTING_INDEXES) == set()
    assert _execute(database_url, home_env, "SELECT COUNT(*) FROM nested_blobs") == [(0,)]
    # Runs go on as before on the upgraded database.
    second = home_env.start_run("watched")
    assert home_env.wait_for_status(second, "completed")["finalOutput"] == {"sum": 3}


# --- v5: the blobs stored values name ----------------------------------------------------

LARGE = {"report": "r" * 10_000}  # split off into a part of its own


def _runs_with_nested_blobs(database_url: str | None, home_env) -> list[tuple]:
    """An old run and a recent one, each with a transcript and a snapshot with a part (the
    part shared), written by the current code; returns the nested_blobs rows it wrote."""
    store = open_state(home_env.home, database_url)
    try:
        with store.transaction():
            for run_id, finished_at in (("old", now_ms() - 40 * DAY_MS), ("recent", now_ms())):
                create_test_run(run_id)
                entries = [{"kind": "text", "text": f"said in {run_id}"}]
                record_transcript(
                    run_id, {"nodeId": "agent", "attemptId": f"{run_id}-1", "entries": entries}
                )
                state_hash = put_json_in_parts({"out": LARGE, "run": run_id})
                Run.update(
                    state_hash=state_hash, status="completed", finished_at=finished_at
                ).where(Run.run_id == run_id).execute()
                RunQueue.update(status="done").where(RunQueue.run == run_id).execute()
            # Old enough that the pass over blobs no row names would take the nested ones.
            Blob.update(created_at=now_ms() - 40 * DAY_MS).execute()
    finally:
        store.close()
    return _nested_rows(database_url, home_env)


def _nested_rows(database_url: str | None, home_env) -> list[tuple]:
    return _execute(
        database_url,
        home_env,
        "SELECT blob_hash, holder_hash FROM nested_blobs ORDER BY blob_hash, holder_hash",
    )


def test_a_v3_database_gets_its_nested_blobs_filled_in_and_the_host_prunes_by_them(
    home_env, database_url
):
    written = _runs_with_nested_blobs(database_url, home_env)
    assert len(written) == 4  # two transcripts, the shared part in two snapshots
    _make_v3(database_url, home_env)
    stored = {row[0] for row in _execute(database_url, home_env, "SELECT event_type FROM events")}
    assert "agent_transcript_recorded" in stored  # v4 renames it before v5 reads it

    home_env.start(PI_WORKFLOWS_RETENTION="0")  # its open upgrades it; no sweep of its own

    assert _execute(database_url, home_env, "SELECT schema_version FROM schema_meta") == [
        (SCHEMA_VERSION,)
    ]
    assert _nested_rows(database_url, home_env) == written
    assert _indexes_named(database_url, home_env, OLD_NESTING_INDEXES) == set()
    pruned = json.loads(
        home_env.cli("state", "prune", "--older-than", "30d", "--apply", "--json").stdout
    )
    assert (pruned["runs"], pruned["transcripts"]) == (1, 1)
    (transcript,) = json.loads(home_env.cli("run", "transcript", "recent", "--json").stdout)
    assert transcript["entries"] == [{"kind": "text", "text": "said in recent"}]
    # The shared part and the recent run's transcript stay; the old run's transcript went.
    assert len(_nested_rows(database_url, home_env)) == 2
    assert home_env.cli("state", "verify").stdout.strip() == "state ok"
