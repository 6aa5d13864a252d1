"""The state store on a real PostgreSQL server (started by the session fixture)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import threading

import peewee
import psycopg2
import pytest

from pi_workflows.canonical import canonical_bytes, sha256_hex
from pi_workflows.errors import BlobConflictError, HostLeaseLostError, PiWorkflowsError
from pi_workflows.host import epoch_lease
from pi_workflows.host.commit_group import CommitGroup
from pi_workflows.host.receipts import OperationResult, StoredAlready, apply_durable
from pi_workflows.protocol.client_messages import ClientRequest
from pi_workflows.storage import (
    SCHEMA_NAME,
    SCHEMA_VERSION,
    blobs,
    open_state,
    record_run_change,
    run_claims,
    run_events,
    run_poison,
    run_workers,
    statements,
    table_statistics,
)
from pi_workflows.storage.blobs import put_json, read_json
from pi_workflows.storage.deferred_statements import HeldCheck
from pi_workflows.storage.models import Blob, HostCommand, HostState, Lease, Run, RunWorker
from pi_workflows.storage.runs import run_record, run_status, statuses_from, statuses_read
from pi_workflows.testing.polling import wait_until
from tests.sent_statements import SentStatements


def test_cli_state_status_against_postgres_shows_the_schema(home_env, postgres_url):
    open_state(home_env.home, postgres_url).close()
    result = home_env.run_cli("--database", postgres_url, "state", "status", "--json")

    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["database"] == "postgresql"
    assert (status["schemaName"], status["schemaVersion"]) == (SCHEMA_NAME, SCHEMA_VERSION)
    assert status["runs"] == {}
    assert "@" not in status["location"]  # no credentials in output


def test_postgres_tables_are_created_with_a_schema_meta_row(home_env, postgres_url):
    open_state(home_env.home, postgres_url).close()
    assert home_env.run_cli("--database", postgres_url, "state", "verify").returncode == 0

    connection = psycopg2.connect(postgres_url)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT schema_name, schema_version FROM schema_meta")
            assert cursor.fetchall() == [(SCHEMA_NAME, SCHEMA_VERSION)]
            cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            tables = {row[0] for row in cursor.fetchall()}
    finally:
        connection.close()
    assert {"runs", "run_queue", "leases", "events", "blobs", "host_state"} <= tables


def test_runs_and_revisions_on_postgres(home_env, postgres_url, make_run):
    store = open_state(home_env.home, postgres_url)
    try:
        with store.transaction():
            make_run("pg-run")
        with store.transaction():
            record_run_change("pg-run", event_type="run.started", actor="test", status="running")
        record = run_record("pg-run")
        assert (record.status, record.revision) == ("running", 2)
        assert [e.event_type for e in run_events("pg-run")] == ["run.created", "run.started"]
    finally:
        store.close()


def test_postgres_transaction_failure_rolls_back(home_env, postgres_url, make_run):
    store = open_state(home_env.home, postgres_url)
    try:
        try:
            with store.transaction():
                make_run("pg-rolled-back")
                raise LookupError("stop")
        except LookupError:
            pass
        assert Run.select().count() == 0
    finally:
        store.close()


def test_postgres_schema_version_mismatch_is_refused(home_env, postgres_url):
    open_state(home_env.home, postgres_url).close()
    assert home_env.run_cli("--database", postgres_url, "state", "status").returncode == 0
    connection = psycopg2.connect(postgres_url)
    try:
        with connection, connection.cursor() as cursor:
            cursor.execute("UPDATE schema_meta SET schema_version = 99")
    finally:
        connection.close()

    result = home_env.run_cli("--database", postgres_url, "state", "status")

    assert result.returncode == 1
    assert "v99" in result.stderr and "upgrade pi-workflows" in result.stderr


def test_a_transaction_sends_its_begin_with_its_first_statement(
    home_env, postgres_url, make_run, monkeypatch
):
    store = open_state(home_env.home, postgres_url)
    try:
        sent = SentStatements(store, monkeypatch)
        with store.transaction():
            assert Run.select().count() == 0
        texts = sent.take()
        assert [text.split(" ")[:2] for text in texts] == [["BEGIN;", "SELECT"], ["COMMIT"]]

        with store.transaction():  # no statement: no transaction on the server either
            pass
        assert sent.take() == []
        connection = store.db.connection()
        assert connection.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE

        # Still one transaction: a failure after the first statement undoes it.
        try:
            with store.transaction():
                make_run("pg-begun-late")
                assert Run.select().count() == 1
                raise LookupError("stop")
        except LookupError:
            pass
        assert sent.take()[-1] == "ROLLBACK"
        assert Run.select().count() == 0
        assert not sent.take()[0].startswith("BEGIN")  # outside a transaction: none held
    finally:
        store.close()


@pytest.fixture
def store(home_env, postgres_url):
    """The state store, on PostgreSQL whatever the backend (this module's subject)."""
    store = open_state(home_env.home, postgres_url)
    try:
        yield store
    finally:
        store.close()


def _announced(run_id: str) -> str | None:
    return Run.get_by_id(run_id).announced_status


def test_a_write_nothing_reads_travels_with_the_next_statement(store, make_run, monkeypatch):
    with store.transaction():
        make_run("pg-held")
    sent = SentStatements(store, monkeypatch)
    with store.transaction():
        # Its values hold a `%`, and the statement it travels with has parameters.
        statements.set_announced_statuses({"pg-held": "100% queued"})
        assert sent.take() == []  # held: no round trip of its own
        assert _announced("pg-held") == "100% queued"
        carried = sent.take()
        assert len(carried) == 1
        assert carried[0].startswith("BEGIN; UPDATE runs SET announced_status")
        assert "; SELECT" in carried[0]
        statements.set_announced_statuses({"pg-held": "queued"})
    # The last one goes with COMMIT, and is committed.
    assert [text.split("; ")[-1] for text in sent.take()] == ["COMMIT"]
    assert _announced("pg-held") == "queued"
    sent.take()

    with store.transaction():  # a write alone makes its transaction's one round trip
        statements.set_announced_statuses({"pg-held": "running"})
    assert [text.split("; ")[::2] for text in sent.take()] == [["BEGIN", "COMMIT"]]
    assert _announced("pg-held") == "running"
    sent.take()

    # Outside a transaction it is not held.
    statements.set_announced_statuses({"pg-held": "queued"})
    assert sent.take()[0].startswith("UPDATE runs SET announced_status")


def test_a_read_with_the_commit_travels_in_its_round_trip(store, make_run, monkeypatch):
    """`StateStore.read_with_commit`: the statuses a transaction asks for are read behind
    its COMMIT, in the same text, and stand for what that commit wrote."""
    with store.transaction():
        make_run("pg-read-a")
        make_run("pg-read-b")
    sent = SentStatements(store, monkeypatch)
    with store.transaction():
        statements.set_announced_statuses({"pg-read-a": "100% queued"})
        read = store.read_with_commit(statuses_read, "pg-read-a")
        assert read is not None
        assert store.read_with_commit(statuses_read, "pg-read-b") is read  # one read, two runs
        assert store.read_with_commit(lambda keys: ("SELECT 1", []), "x") is None  # one only
        Run.update(status_detail="written last").where(Run.run_id == "pg-read-b").execute()
        assert read.rows is None  # not before the commit
    (*_, last) = sent.take()
    assert last.startswith("COMMIT; SELECT") and "pg-read-a" in last and "pg-read-b" in last
    assert sent.take() == []  # and nothing after it
    assert read.commit_number == store.commits
    statuses = statuses_from(read.rows or [])
    assert statuses == {run_id: run_status(run_id) for run_id in ("pg-read-a", "pg-read-b")}
    assert statuses["pg-read-b"]["statusDetail"] == "written last"

    with pytest.raises(LookupError), store.transaction():  # rolled back: nothing read
        Run.update(status_detail="undone").where(Run.run_id == "pg-read-a").execute()
        undone = store.read_with_commit(statuses_read, "pg-read-a")
        raise LookupError("stop")
    assert undone is not None and undone.rows is None and undone.commit_number is None
    with store.transaction():  # a transaction that sent nothing commits nothing to read behind
        idle = store.read_with_commit(statuses_read, "pg-read-a")
    assert idle is not None and idle.rows is None
    assert store.read_with_commit(statuses_read, "pg-read-a") is None  # outside a transaction


def test_a_new_small_blob_travels_with_the_next_statement_and_is_read_back_before_commit(
    store, monkeypatch
):
    sent = SentStatements(store, monkeypatch)
    small = {"held": "an insert nobody waits for"}
    with store.transaction():
        small_hash = put_json(small)
        assert sent.take() == []  # no round trip of its own
    (carried, commit) = sent.take()
    assert carried.startswith("BEGIN; INSERT INTO blobs")  # with the check that reads it back
    assert "FROM blobs WHERE blob_hash IN" in carried and commit == "COMMIT"
    assert read_json(small_hash) == small
    sent.take()

    large = {"large": "x" * (blobs.HELD_INSERT_MAX_BYTES + 1)}
    with store.transaction():
        large_hash = put_json(large)
        (inserted,) = sent.take()  # at once, and never read back
    assert inserted.startswith("BEGIN; INSERT INTO blobs") and sent.take() == ["COMMIT"]
    assert read_json(large_hash) == large


def test_blobs_held_with_writes_and_checks_between_go_as_one_insert(store, make_run, monkeypatch):
    """A worker's write stores its node's output and its new state, then the next
    node's: blob inserts held with only writes and checks between them go as one insert
    of all their rows, in the first one's place (a blob row references nothing, so every
    reference to it still comes after it, and no check reads blobs). A savepoint's edge
    keeps them apart."""
    with store.transaction():
        make_run("pg-blobs")
    sent = SentStatements(store, monkeypatch)
    with store.transaction():
        first = put_json({"first": 1})
        statements.set_announced_statuses({"pg-blobs": "queued"})  # a write between
        second = put_json({"second": 2})
        run_status("pg-blobs")
        (carried,) = sent.take()
    assert carried.count("INSERT INTO blobs") == 1, carried
    (inserts,) = [text for text in carried.split("; ") if text.startswith("INSERT INTO blobs")]
    assert first in inserts and second in inserts
    assert carried.index("INSERT INTO blobs") < carried.index("UPDATE runs SET announced_status")
    assert (read_json(first), read_json(second)) == ({"first": 1}, {"second": 2})

    sent.take()
    with store.transaction():
        third = put_json({"third": 3})
        assert statements.hold_check("SELECT 1 / 1", (), HeldCheck(HostLeaseLostError))
        fourth = put_json({"fourth": 4})
        run_status("pg-blobs")
        (carried,) = sent.take()
    # One insert (prepared by now: EXECUTE), in front of the check.
    parts = carried.split("; ")
    (with_third,) = [index for index, text in enumerate(parts) if third in text]
    assert fourth in parts[with_third] and with_third < parts.index("SELECT 1 / 1"), carried
    assert (read_json(third), read_json(fourth)) == ({"third": 3}, {"fourth": 4})

    with store.transaction():
        fifth = put_json({"fifth": 5})
        with store.savepoint():
            sixth = put_json({"sixth": 6})
        run_status("pg-blobs")
    parts = [part for text in sent.take() for part in text.split("; ")]
    (with_fifth,) = [index for index, text in enumerate(parts) if fifth in text]
    (with_sixth,) = [index for index, text in enumerate(parts) if sixth in text]
    assert with_fifth < with_sixth, parts
    assert (read_json(fifth), read_json(sixth)) == ({"fifth": 5}, {"sixth": 6})


def test_a_commit_reads_the_blobs_it_took_up_with_what_it_announces_and_holds_them(
    store, make_run, monkeypatch, postgres_url
):
    """The end of a transaction reads the rows of the blobs it took up (to compare and
    hold them) in the statement that reads what it announces: one round trip, not two,
    and a prune still cannot delete them before the COMMIT."""
    with store.transaction():
        make_run("pg-announced")
        stored = put_json({"taken": "up"})
    sent = SentStatements(store, monkeypatch)
    other = psycopg2.connect(postgres_url)
    deletes: list[type[Exception]] = []
    check_read = blobs.check_read

    def delete_then_check(taken_up, found):
        # Between that read and the COMMIT: a prune's delete of the row must wait.
        with other.cursor() as cursor, pytest.raises(psycopg2.errors.LockNotAvailable) as e:
            cursor.execute("SET lock_timeout = '50ms'")
            cursor.execute("DELETE FROM blobs WHERE blob_hash = %s", (stored,))
        deletes.append(e.type)
        other.rollback()
        check_read(taken_up, found)

    monkeypatch.setattr(blobs, "check_read", delete_then_check)
    try:
        with store.transaction():
            record_run_change("pg-announced", event_type="run.started", actor="t", status="running")
            assert put_json({"taken": "up"}) == stored  # taken up: nothing read yet
            sent.take()
    finally:
        other.close()
    reads = [text for text in sent.take() if "FROM blobs" in text]
    assert len(reads) == 1, reads
    assert "FOR KEY SHARE" in reads[0] and "JOIN run_queue" in reads[0]  # one read of both
    assert deletes == [psycopg2.errors.LockNotAvailable]
    assert read_json(stored) == {"taken": "up"}
    assert run_status("pg-announced")["status"] == "running"


def test_a_held_blob_insert_that_finds_a_corrupted_row_fails_before_commit(store, make_run):
    value = {"stored": "by another writer, corrupted since"}
    blob_hash = sha256_hex(canonical_bytes(value))
    Blob.insert(
        blob_hash=blob_hash,
        media_type="application/json",
        byte_length=5,
        content=b"{...}",
        created_at=1,
    ).execute()
    with pytest.raises(BlobConflictError, match=blob_hash[:12]), store.transaction():
        make_run("pg-never-committed")
        put_json(value)
    assert Run.get_or_none(Run.run_id == "pg-never-committed") is None


class _CheckFailed(Exception):
    """What the held check of the test below raises."""


def test_a_held_check_that_fails_refuses_the_rest_of_its_transaction(store, make_run, monkeypatch):
    """`DeferredStatements.hold_check`: the check goes with the next statement; once it
    failed, whoever catches its error, nothing more of the transaction runs or commits."""
    with store.transaction():
        make_run("pg-checked")
    held = store.held_statements
    check = "SELECT 1 / (SELECT count(*)::int FROM runs WHERE run_id = %s)"
    sent = SentStatements(store, monkeypatch)
    with store.transaction():
        assert held.hold_check(check, ["pg-checked"], HeldCheck(_CheckFailed))
        assert sent.take() == []
        make_run("pg-after-a-check")
    first = sent.take()[0]
    assert first.startswith("BEGIN; SELECT 1 / (SELECT count(*)::int FROM runs")
    assert "INSERT" in first  # the transaction's first statement, in the same round trip

    with pytest.raises(_CheckFailed), store.transaction():
        assert held.hold_check(check, ["no-such-run"], HeldCheck(_CheckFailed))
        with pytest.raises(_CheckFailed):
            make_run("pg-never-written")  # its inserts are held too
            Run.select().count()  # the first statement sent: the check goes with it
        with pytest.raises(_CheckFailed):  # caught above: the transaction still refuses
            Run.select().count()
    # The COMMIT at the block's end raised too: nothing was written.
    assert Run.get_or_none(Run.run_id == "pg-never-written") is None
    with pytest.raises(_CheckFailed), store.transaction():
        assert held.hold_check(check, ["no-such-run"], HeldCheck(_CheckFailed))
        statements.set_announced_statuses({"pg-checked": "held"})  # goes with the COMMIT
    assert _announced("pg-checked") != "held"
    assert Run.get_or_none(Run.run_id == "pg-after-a-check") is not None
    assert held.hold_check(check, ["pg-checked"], HeldCheck(_CheckFailed)) is False  # outside one


def _fenced_on_a_shared_database(store, key: str) -> epoch_lease.EpochLease:
    """The store's transactions fenced as a host's on a shared database are: the host
    lease is taken here, and its fence travels with each transaction's first statement."""
    with store.transaction():
        lease = epoch_lease.acquire_epoch(
            f"host-{key}", os.getpid(), "", key=key, socket_address="vm:/s", single_host=False
        )
    store.fence = lambda later: epoch_lease.fence(lease, later=later)
    return lease


def test_a_group_commit_takes_the_host_fence_with_its_first_statement(store, make_run, monkeypatch):
    """A host's fence on a shared database (`epoch_lease.fence`) travels with a group
    commit's first statement; a lease lost since refuses every entry, and nothing of
    them is written. Any other transaction checks the lease before its block runs."""
    lease = _fenced_on_a_shared_database(store, "fenced")
    with store.transaction():
        make_run("pg-fenced-a")
        make_run("pg-fenced-b")
    sent = SentStatements(store, monkeypatch)

    def group_of(*run_ids: str) -> list:
        async def together() -> list:
            group = CommitGroup(store, lambda freed: None)
            futures = [
                group.submit(
                    functools.partial(
                        record_run_change, run_id, event_type="run.started", actor="test"
                    )
                )
                for run_id in run_ids
            ]
            return await asyncio.gather(*futures, return_exceptions=True)

        return asyncio.run(together())

    assert group_of("pg-fenced-a", "pg-fenced-b") == [2, 2]
    first = sent.take()[0]
    assert first.startswith(
        "BEGIN; SELECT 1 / (SELECT count(*)::int FROM (SELECT 1 FROM host_state"
    )
    # and the first entry's first statement, in one round trip: the group is one block
    assert first.endswith("RETURNING revision")
    assert not [text for text in [first, *sent.take()] if "SAVEPOINT" in text]

    HostState.update(expires_at=0).where(HostState.id == lease.row_id).execute()
    refused = group_of("pg-fenced-a", "pg-fenced-b")
    assert [type(error) for error in refused] == [HostLeaseLostError, HostLeaseLostError]
    assert [Run.get_by_id(r).revision for r in ("pg-fenced-a", "pg-fenced-b")] == [2, 2]
    with pytest.raises(HostLeaseLostError), store.transaction():
        pytest.fail("the block of a transaction whose fence fails never runs")


def _unknown_worker_reply(message_id: str) -> None:
    """A held write that fails: its worker row does not exist (a foreign key)."""
    statements.insert_worker_message("no-such-worker", message_id, "f", "ok", 1, None, None, 1)


def test_a_held_write_that_fails_undoes_its_savepoint_block_alone(store, make_run, monkeypatch):
    with store.transaction():
        make_run("pg-kept")
        make_run("pg-undone")
    sent = SentStatements(store, monkeypatch)
    with store.transaction():
        with store.savepoint():
            record_run_change("pg-kept", event_type="run.started", actor="test")
        with pytest.raises(peewee.IntegrityError), store.savepoint():
            record_run_change("pg-undone", event_type="run.started", actor="test")
            _unknown_worker_reply("m-1")
        # The transaction goes on: the failure was inside the block.
        with store.savepoint():  # a block that sent nothing sends no savepoint
            pass
    texts = sent.take(prepares=True)
    # The failing write went with the block's release, and the block was undone.
    failed = next(index for index, text in enumerate(texts) if "worker_messages" in text)
    assert texts[failed].endswith("; RELEASE SAVEPOINT piw_block")
    assert texts[failed + 1] == "ROLLBACK TO SAVEPOINT piw_block; RELEASE SAVEPOINT piw_block"
    assert "SAVEPOINT" not in " ".join(texts[failed + 2 :])
    committed = next(index for index, text in enumerate(texts) if text.endswith("COMMIT"))
    # After it, between transactions, only the statements it ran twice are prepared.
    assert all(text.startswith("PREPARE ") for text in texts[committed + 1 :])
    assert [record.revision for record in map(run_record, ("pg-kept", "pg-undone"))] == [2, 1]

    # A block that fails before it sent anything sends nothing, held writes included.
    with store.transaction():
        assert Run.select().count() == 2
        sent.take()
        with pytest.raises(LookupError), store.savepoint():
            _unknown_worker_reply("m-2")
            raise LookupError("stop")
    assert sent.take() == ["COMMIT"]

    # A write held before a block opens is sent before it: its failure is not the
    # block's, and the block does not run.
    body_ran = False
    with pytest.raises(peewee.IntegrityError), store.transaction():
        assert Run.select().count() == 2
        _unknown_worker_reply("m-3")
        with store.savepoint():
            body_ran = True
    assert not body_ran


def test_the_claim_candidate_query_is_planned_once_per_connection(
    home_env, postgres_url, make_run, monkeypatch
):
    store = open_state(home_env.home, postgres_url)
    try:
        with store.transaction():
            make_run("pg-claimable")
        sent = SentStatements(store, monkeypatch)
        for _ in range(3):
            with store.transaction():
                assert run_claims.claim_candidates("host-a", set()) == ["pg-claimable"]
        verbs = [text.removeprefix("BEGIN; ").split(" ")[0] for text in sent.take(prepares=True)]
        # Sent as it is twice, prepared between transactions, then only executed.
        assert verbs == ["SELECT", "COMMIT", "SELECT", "COMMIT", "PREPARE", "EXECUTE", "COMMIT"]
        # The server keeps one plan for it (by default it plans it anew for every call).
        assert store.db.execute_sql("SHOW plan_cache_mode").fetchone() == ("force_generic_plan",)
        sent.take()

        store.db.close()  # a new connection holds no prepared statement: prepared again
        store.db.connect()
        for _ in range(3):
            with store.transaction():
                assert run_claims.claim_candidates("host-a", {"pg-claimable"}) == []
        verbs = [text.removeprefix("BEGIN; ").split(" ")[0] for text in sent.take(prepares=True)]
        assert verbs == ["SELECT", "COMMIT", "SELECT", "COMMIT", "PREPARE", "EXECUTE", "COMMIT"]
    finally:
        store.close()


def test_a_new_runs_rows_travel_with_the_transactions_next_statement(store, make_run, monkeypatch):
    """A start reads none of its inserts back (the run, its creation event, its queue row
    and lease): they go in front of the transaction's next statement."""
    sent = SentStatements(store, monkeypatch)
    with store.transaction():
        make_run("pg-held-start")
        assert sent.take() == []  # no round trip of its own
        assert Run.select().where(Run.run_id == "pg-held-start").count() == 1
        (carried,) = sent.take()
    inserted = [part.split()[2] for part in carried.split("; ") if part.startswith("INSERT INTO")]
    assert {"runs", "events", "run_queue", "leases"} <= set(inserted)
    assert carried.startswith("BEGIN; ") and carried.split("; ")[-1].startswith("SELECT COUNT")


def _a_claimed_run(store, make_run, run_id: str) -> tuple[str, run_claims.Claim]:
    """A run made and claimed by host-1, each in a transaction of its own."""
    with store.transaction():
        make_run(run_id)
    token = run_claims.new_claim_token()
    with store.transaction():
        claim = run_claims.claim_run(run_id, "host-1", token)
    assert claim is not None
    return token, claim


def test_a_worker_write_holds_its_run_and_sends_its_bumps_with_the_next_statement(
    store, make_run, monkeypatch, postgres_url
):
    """`claimed_run` reads the run `FOR UPDATE`: until the transaction ends nobody else
    changes the row, so the transaction's bumps of it are held writes, and the revision
    each reaches is known without a round trip."""
    token, claim = _a_claimed_run(store, make_run, "pg-worker-run")
    sent = SentStatements(store, monkeypatch)
    other = psycopg2.connect(postgres_url)
    try:
        with store.transaction():
            revision, _ = run_claims.claimed_run("pg-worker-run", token, claim.generation)
            assert sent.take()  # the claim's read, the one round trip so far
            for event_type in ("run.started", "node.started"):
                revision = record_run_change("pg-worker-run", event_type=event_type, actor="t")
            assert sent.take() == []  # both held
            with other.cursor() as cursor, pytest.raises(psycopg2.errors.LockNotAvailable):
                cursor.execute("SET lock_timeout = '50ms'")
                cursor.execute("UPDATE runs SET paused = true WHERE run_id = 'pg-worker-run'")
            other.rollback()
    finally:
        other.close()
    assert run_record("pg-worker-run").revision == revision == 4
    assert [e.revision for e in run_events("pg-worker-run")] == [1, 2, 3, 4]


def test_two_bumps_of_a_run_with_only_writes_between_go_as_one_update(store, make_run, monkeypatch):
    """A worker's write bumps its run twice (the node's end, the new state): the second
    bump takes the place of the first while it waits, one ``UPDATE`` to the second's
    revision with both's columns, the later values winning, and their events one insert.
    A check held between them (it reads what the first wrote) keeps them apart."""
    token, claim = _a_claimed_run(store, make_run, "pg-bumped")
    sent = SentStatements(store, monkeypatch)
    with store.transaction():
        revision, _ = run_claims.claimed_run("pg-bumped", token, claim.generation) or (0, "")
        sent.take()
        record_run_change("pg-bumped", event_type="node.started", actor="t", status_detail="a")
        put_json({"between": "a write of another row"})
        record_run_change(
            "pg-bumped", event_type="node.completed", actor="t", status_detail="b", paused=True
        )
        run_status("pg-bumped")
        (carried,) = sent.take()
    assert carried.count("UPDATE runs SET revision") == 1, carried
    # Their two events go as one insert of two rows.
    (events,) = [text for text in carried.split("; ") if "'node.started'" in text]
    assert "'node.completed'" in events, carried
    record = run_record("pg-bumped")
    assert (record.revision, record.paused) == (revision + 2, True)
    assert run_status("pg-bumped")["statusDetail"] == "b"
    assert [e.revision for e in run_events("pg-bumped")][-2:] == [revision + 1, revision + 2]

    with store.transaction():
        run_claims.claimed_run("pg-bumped", token, claim.generation)
        sent.take()
        record_run_change("pg-bumped", event_type="node.started", actor="t", status_detail="c")
        assert statements.hold_check("SELECT 1 / 1", (), HeldCheck(HostLeaseLostError))
        record_run_change("pg-bumped", event_type="node.completed", actor="t", paused=False)
        run_status("pg-bumped")
        (carried,) = sent.take()
    assert carried.count("UPDATE runs SET revision") == 2, carried
    assert carried.index("UPDATE runs SET revision") < carried.index("SELECT 1 / 1")
    record = run_record("pg-bumped")
    assert (record.revision, record.paused) == (revision + 4, False)
    assert run_status("pg-bumped")["statusDetail"] == "c"

    # Events join only their own run's: another run's row is inserted after the first
    # run's event (joined there, the second run's event would come before its run).
    with store.transaction():
        make_run("pg-first")
        make_run("pg-second")
    assert [e.event_type for e in run_events("pg-second")] == ["run.created"]


def test_the_events_of_runs_committed_before_go_as_one_insert(store, make_run, monkeypatch):
    """A group's writes append events to several runs: those of runs committed before
    the transaction go as one insert of several rows, in the first one's place, across
    the checks and writes between; a run the transaction creates has its events inserted
    after its row, never joined with the earlier ones."""
    claims = {run_id: _a_claimed_run(store, make_run, run_id) for run_id in ("ev-1", "ev-2")}
    sent = SentStatements(store, monkeypatch)
    with store.transaction():
        for run_id, (token, claim) in claims.items():
            assert run_claims.claimed_run(run_id, token, claim.generation)  # holds the row
        sent.take()
        record_run_change("ev-1", event_type="node.started", actor="t")
        assert statements.hold_check("SELECT 1 / 1", (), HeldCheck(HostLeaseLostError))
        make_run("ev-new")
        record_run_change("ev-2", event_type="node.started", actor="t")
        run_status("ev-1")
        (carried,) = sent.take()
    parts = carried.split("; ")
    (started,) = [index for index, text in enumerate(parts) if "'node.started'" in text]
    assert "'ev-2'" in parts[started] and started < parts.index("SELECT 1 / 1"), carried
    (created,) = [index for index, text in enumerate(parts) if "'run.created'" in text]
    first_of_new = min(index for index, text in enumerate(parts) if "'ev-new'" in text)
    assert started < first_of_new < created, carried  # the new run's row, then its event
    assert [e.event_type for e in run_events("ev-new")] == ["run.created"]
    for run_id in claims:
        assert run_events(run_id)[-1].event_type == "node.started"


class _RunElsewhere(Exception):
    """What the held claim check of the test below raises."""


def test_a_worker_writes_claim_check_travels_with_its_next_statement_and_holds_the_run(
    store, make_run, monkeypatch, postgres_url
):
    """`hold_claimed_run_check`: where the host knows the revision and status a worker's
    write should find, the claim's check goes with the write's next statement, holds the
    run's row as the read does, and the bumps after it know their revision."""
    token, claim = _a_claimed_run(store, make_run, "pg-checked")
    (revision, status) = run_claims.claimed_run("pg-checked", token, claim.generation) or ()
    sent = SentStatements(store, monkeypatch)
    other = psycopg2.connect(postgres_url)
    try:
        with store.transaction():
            assert run_claims.hold_claimed_run_check(
                "pg-checked", token, claim.generation, (revision, status), _RunElsewhere
            )
            bumped = record_run_change("pg-checked", event_type="run.started", actor="t")
            assert sent.take() == []  # no round trip so far
            assert run_status("pg-checked")["revision"] == bumped == revision + 1
            (carried,) = sent.take()
            assert carried.index("FOR UPDATE OF r") < carried.index("UPDATE runs SET revision")
            with other.cursor() as cursor, pytest.raises(psycopg2.errors.LockNotAvailable):
                cursor.execute("SET lock_timeout = '50ms'")
                cursor.execute("UPDATE runs SET paused = true WHERE run_id = 'pg-checked'")
            other.rollback()
    finally:
        other.close()
    assert run_record("pg-checked").revision == revision + 1

    # Found elsewhere (another revision, another status, a claim moved on): the next
    # statement raises the check's error, and nothing of the transaction commits.
    for expected, generation in (
        ((revision, status), claim.generation + 1),
        ((revision, status), claim.generation),  # the revision moved on above
        ((revision + 1, "completed"), claim.generation),
    ):
        with pytest.raises(_RunElsewhere), store.transaction():
            # A check of another kind travels with it (the host's fence does): the error
            # raised is the one of the check that failed.
            assert statements.hold_check("SELECT 1 / 1", (), HeldCheck(HostLeaseLostError))
            assert run_claims.hold_claimed_run_check(
                "pg-checked", token, generation, expected, _RunElsewhere
            )
            # Two of one kind that fail differently could not be told apart: the second is
            # refused (the caller reads); one that fails alike goes with the first.
            assert not run_claims.hold_claimed_run_check(
                "pg-checked", token, generation, expected, _Moved
            )
            assert run_claims.hold_claimed_run_check(
                "pg-checked", token, claim.generation, (revision + 1, status), _RunElsewhere
            )
            record_run_change("pg-checked", event_type="run.started", actor="t")
            with contextlib.suppress(_RunElsewhere):  # whoever swallows it, nothing commits
                run_status("pg-checked")
        assert run_record("pg-checked").revision == revision + 1
    # Outside a transaction it cannot travel: the caller reads.
    assert not run_claims.hold_claimed_run_check(
        "pg-checked", token, claim.generation, (revision + 1, status), _RunElsewhere
    )


class _Moved(PiWorkflowsError):
    """What the claim checks of the group below raise (a refusal of ours)."""


def _claim_checked_group(
    store, make_run, monkeypatch, run_ids: tuple[str, ...], moved: str = ""
) -> tuple[list, list[str]]:
    """One group commit of a write to each of `run_ids` (claimed runs), each checking its
    claim as a worker's write does (`hold_claimed_run_check`), the check of `moved`
    expecting a revision its run is not at; a host's fence on a shared database. What
    each entry came to, and the texts the group sent."""
    claims = {run_id: _a_claimed_run(store, make_run, run_id) for run_id in run_ids}
    found = {r: run_claims.claimed_run(r, t, c.generation) for r, (t, c) in claims.items()}
    _fenced_on_a_shared_database(store, "grouped")
    sent = SentStatements(store, monkeypatch)

    def write(run_id: str) -> int:
        token, claim = claims[run_id]
        revision, status = found[run_id] or (0, "")
        expected = (revision + 1, status) if run_id == moved else (revision, status)
        assert run_claims.hold_claimed_run_check(run_id, token, claim.generation, expected, _Moved)
        return record_run_change(run_id, event_type="run.started", actor="t")

    async def together() -> list:
        group = CommitGroup(store, lambda freed: None)
        futures = [group.submit(functools.partial(write, r)) for r in claims]
        return await asyncio.gather(*futures, return_exceptions=True)

    outcomes = asyncio.run(together())
    return outcomes, sent.take()


def test_a_group_of_worker_writes_is_two_round_trips_and_no_savepoint(store, make_run, monkeypatch):
    """A group is applied as one block first: its entries' checks and writes travel
    together, with the fence and the read of what the commit announces, and its
    ``COMMIT`` is the only other round trip."""
    runs = ("one-1", "one-2", "one-3")
    outcomes, texts = _claim_checked_group(store, make_run, monkeypatch, runs)
    assert outcomes == [3, 3, 3]
    assert [run_record(r).revision for r in runs] == [3, 3, 3]
    assert len(texts) == 2, texts
    assert texts[0].startswith("BEGIN; SELECT 1 / (SELECT count(*)::int FROM (SELECT 1 FROM host_")
    assert texts[0].count("SELECT ln((SELECT count(*) FROM") == 3
    assert texts[1].endswith("COMMIT")
    assert not [t for t in texts if "SAVEPOINT" in t]


def test_a_failed_claim_check_in_a_group_commit_undoes_its_entry_alone(
    store, make_run, monkeypatch
):
    """A claim check that fails undoes its entry and no other: the group, applied as one
    block, fails, and is applied again with each entry in a savepoint of its own, where
    the check fails its entry alone; the rest commits, and the host's fence still
    travels first."""
    runs = ("g-1", "g-2", "g-3")
    outcomes, texts = _claim_checked_group(store, make_run, monkeypatch, runs, moved="g-2")
    assert [type(o) for o in outcomes] == [int, _Moved, int]
    assert [run_record(r).revision for r in runs] == [3, 2, 3]
    assert texts[0].startswith("BEGIN; SELECT 1 / (SELECT count(*)::int FROM (SELECT 1 FROM host_")
    # The three in the group's one text (the second fails it), then each in its entry's
    # block: the group is applied again, and refuses the second alone.
    checks = [t.count("SELECT ln((SELECT count(*) FROM") for t in texts if "ln(" in t]
    assert checks == [3, 1, 1, 1]
    assert not [t for t in texts if '"t1"."revision", "t1"."status"' in t]  # no claim read


def _start_request(request_id: str, key: str, name: str = "a") -> ClientRequest:
    payload = {"name": name}
    raw = {"requestId": request_id, "idempotencyKey": key, "payload": payload}
    return ClientRequest(request_id, "client-1", "run.start", key, payload, None, None, raw)


def test_a_requests_look_for_an_earlier_receipt_travels_with_its_writes(store, monkeypatch):
    """`apply_durable(held=True)`: that no receipt is stored for the request is checked
    with its next statement, not read first; a request stored already (by its id, or by
    its client's idempotency key) then fails with `StoredAlready`, having written
    nothing, and applied again without the check it is adopted, or is a conflict."""
    applied: list[str] = []

    def operation() -> OperationResult:
        applied.append("applied")
        return OperationResult("accepted", receipt={"runId": "r-1"})

    def apply(request: ClientRequest, *, held: bool) -> dict:
        with store.transaction():
            return apply_durable(request, 1, operation, held=held)

    sent = SentStatements(store, monkeypatch)
    assert apply(_start_request("req-1", "key-1"), held=True)["outcome"] == "accepted"
    texts = sent.take()
    assert not [t for t in texts if "SELECT request_id = " in t]  # no read of its own
    first = texts[0]
    assert first.startswith("BEGIN") and first.index("sqrt(") < first.index("host_commands (")

    for request, outcome in (
        (_start_request("req-1", "key-1"), "adopted"),  # sent again
        (_start_request("req-2", "key-1", "b"), "conflict"),  # its key, another payload
    ):
        with pytest.raises(StoredAlready):
            apply(request, held=True)
        assert apply(request, held=False)["outcome"] == outcome
    # The two refused ran, and were rolled back: only the first's receipt is stored.
    assert applied == ["applied", "applied", "applied"]
    assert HostCommand.select().count() == 1


def test_a_held_claim_check_never_crosses_a_savepoint_edge(store, make_run):
    """A check held in a block goes before a savepoint opened inside it, and with the
    block's release: its failure is that block's, never another's."""
    token, claim = _a_claimed_run(store, make_run, "pg-edges")
    revision, status = run_claims.claimed_run("pg-edges", token, claim.generation) or (0, "")
    moved = (revision + 1, status)
    with store.transaction():
        with pytest.raises(_Moved), store.savepoint():
            assert run_claims.hold_claimed_run_check(
                "pg-edges", token, claim.generation, moved, _Moved
            )
            with store.savepoint():  # the outer check goes now, and fails the outer block
                pytest.fail("the inner block never runs")
        with pytest.raises(_Moved), store.savepoint():
            assert run_claims.hold_claimed_run_check(
                "pg-edges", token, claim.generation, moved, _Moved
            )  # nothing else in the block: it goes with the release
        record_run_change("pg-edges", event_type="run.started", actor="t")  # goes on
    assert run_record("pg-edges").revision == revision + 1


def test_a_run_claimed_by_the_transaction_that_created_it_needs_no_read(
    store, make_run, monkeypatch
):
    """A start that claims its run at once (`revisions.created_unchanged`): the queue row,
    the lease and the launch's fields are what the transaction itself wrote, so the claim
    and its worker's launch read nothing, and the lease is taken by a held write."""
    sent = SentStatements(store, monkeypatch)
    with store.transaction():
        make_run("pg-fresh")
        claim = run_claims.claim_run("pg-fresh", "host-1", run_claims.new_claim_token())
        (*_, revision), progress = run_poison.launch_read("pg-fresh")
        assert sent.take() == []  # all of it held, for the COMMIT
    assert claim is not None and claim.generation == 1
    assert (revision, progress) == (2, run_poison.ProgressMark(0, "queued"))
    lease = Lease.get_by_id("pg-fresh")
    assert (lease.generation, lease.owner_id) == (1, "host-1")
    assert run_record("pg-fresh").queue_status == "starting"

    # A run created by an earlier transaction is read as before.
    with store.transaction():
        make_run("pg-earlier")
    sent.take()
    with store.transaction():
        assert run_claims.claim_run("pg-earlier", "host-1", run_claims.new_claim_token())
        assert sent.take()  # the claim's read


def test_a_workers_ready_bookkeeping_is_one_round_trip(store, make_run, monkeypatch):
    """worker.ready's bookkeeping (`WorkerGateway._record_ready`): the worker row's pid is
    a held write, sent with the claim's check that holds the run; the queue's `running`
    and its bump go with the COMMIT."""
    token, claim = _a_claimed_run(store, make_run, "pg-ready")
    with store.transaction():
        run_workers.record_worker("worker-ready", "pg-ready", claim.generation, 1, "0" * 64, 1)
    sent = SentStatements(store, monkeypatch)
    with store.transaction():
        run_workers.mark_running("worker-ready", 4242, "start-identity")
        assert sent.take() == []
        assert run_claims.mark_running("pg-ready", token, claim.generation, never_ran=True)
        assert len(sent.take()) == 1  # the claim's check, the held write in front of it
    worker = RunWorker.get_by_id("worker-ready")
    assert (worker.status, worker.pid) == ("running", 4242)
    assert run_record("pg-ready").queue_status == "running"


def test_the_replies_of_a_groups_workers_go_as_one_insert(store, make_run, monkeypatch):
    """Each worker write's reply is stored with it: the replies of a group's writes,
    applied as one block with only writes and each write's claim check between them, go
    as one insert of several rows, in the first one's place; a savepoint's edge (a group
    applied entry by entry) keeps them apart."""
    workers = {}
    for number in (1, 2, 3, 4):
        run_id = f"pg-replies-{number}"
        _, claim = _a_claimed_run(store, make_run, run_id)
        workers[run_id] = f"worker-replies-{number}"
        with store.transaction():
            run_workers.record_worker(workers[run_id], run_id, claim.generation, 1, "0" * 64, 1)
    sent = SentStatements(store, monkeypatch)

    def reply(number: int) -> None:
        statements.insert_worker_message(
            f"worker-replies-{number}", f"message-{number}", "f" * 64, "accepted", 1, None, None, 1
        )

    with store.transaction():
        reply(1)
        statements.set_announced_statuses({"pg-replies-1": "running"})  # a write between
        assert statements.hold_check("SELECT 1 / 1", (), HeldCheck(HostLeaseLostError))
        reply(2)
        run_status("pg-replies-1")
        (carried,) = sent.take()
    parts = carried.split("; ")
    (together,) = [i for i, text in enumerate(parts) if "'message-1'" in text]
    assert "'message-2'" in parts[together], carried  # one insert, in the first one's place
    (between,) = [i for i, text in enumerate(parts) if "'running'" in text]
    assert together < between, carried

    with store.transaction():
        with store.savepoint():
            reply(3)
        with store.savepoint():
            reply(4)
        run_status("pg-replies-1")
    statements_sent = [part for text in sent.take() for part in text.split("; ")]
    (with_3,) = [i for i, text in enumerate(statements_sent) if "'message-3'" in text]
    (with_4,) = [i for i, text in enumerate(statements_sent) if "'message-4'" in text]
    assert with_3 != with_4, statements_sent
    for number in (1, 2, 3, 4):
        stored = statements.worker_message(f"worker-replies-{number}", f"message-{number}")
        assert stored == ("f" * 64, "accepted", 1, None, None)


def test_a_claim_and_its_launch_are_one_round_trip_that_holds_the_claim_and_the_run(
    store, make_run, monkeypatch, postgres_url
):
    """`claim_run`'s read locks the claim's row and the run's (`FOR UPDATE`): nobody
    changes either until the transaction ends, so the compare-and-set on the lease's
    generation and the claim's bump travel with the transaction's next statement; the
    same read brings what the worker's launch needs."""
    with store.transaction():
        make_run("pg-claimed")
    sent = SentStatements(store, monkeypatch)
    other = psycopg2.connect(postgres_url)
    try:
        with store.transaction():
            claim = run_claims.claim_run("pg-claimed", "host-1", run_claims.new_claim_token())
            assert claim is not None and claim.generation == 1
            assert len(sent.take()) == 1  # the read; the writes are held
            # Its worker's launch is what that read found (`run_poison.launch_read`).
            launch = run_poison.launch_read("pg-claimed")
            assert sent.take() == []
            for update in ("leases SET heartbeat_at = 0", "runs SET paused = true"):
                with other.cursor() as cursor, pytest.raises(psycopg2.errors.LockNotAvailable):
                    cursor.execute("SET lock_timeout = '50ms'")
                    cursor.execute(f"UPDATE {update} WHERE run_id = 'pg-claimed'")
                other.rollback()
    finally:
        other.close()
    assert launch == run_poison.launch_read("pg-claimed")  # (read, now)
    assert launch[0][4] == 2 and launch[1] == run_poison.ProgressMark(0, "queued")
    lease = Lease.get_by_id("pg-claimed")
    assert (lease.generation, lease.owner_id) == (1, "host-1")
    assert run_record("pg-claimed").queue_status == "starting"
    assert [(e.revision, e.event_type) for e in run_events("pg-claimed")] == [
        (1, "run.created"),
        (2, "lease.claimed"),
    ]


def _manual_analyses(server, url: str) -> dict[str, int]:
    database = url.rsplit("/", 1)[1]
    found = server.execute(
        "SELECT relname, analyze_count FROM pg_stat_user_tables "
        "WHERE relname IN ('blobs', 'forwarded_commands', 'other_app')",
        database,
    )
    return {str(name): int(str(count)) for name, count in found}


def test_a_store_analyzes_the_tables_it_grew_on_a_schedule_of_its_commits(
    store, postgres_server, postgres_url
):
    """A new database's tables are nearly empty when the store prepares its statements:
    after its 64th commit, and its 256th, the store analyzes (on a connection of its
    own) the tables that more than doubled since they were last analyzed, so that the
    server plans their statements again for their size; a table that stayed empty is
    left alone, and so is another application's table in the same schema, and closing
    the store waits for a pass that runs."""
    keeper = store.statistics
    analyses = functools.partial(_manual_analyses, postgres_server, postgres_url)
    postgres_server.execute(
        "CREATE TABLE other_app AS SELECT g FROM generate_series(1, 5000) AS g",
        postgres_url.rsplit("/", 1)[1],
    )

    def commit_blobs_until(commits: int) -> None:
        while store.commits < commits:
            with store.transaction():
                put_json({"commit": store.commits, "padding": "x" * 1500})

    commit_blobs_until(table_statistics.FIRST_ANALYZE_AT - 1)
    assert keeper.passes == 0
    commit_blobs_until(table_statistics.FIRST_ANALYZE_AT)
    assert keeper.passes == 1
    wait_until(lambda: analyses()["blobs"] == 1, what="an ANALYZE")

    commit_blobs_until(table_statistics.FIRST_ANALYZE_AT * table_statistics.ANALYZE_GROWTH - 1)
    assert keeper.passes == 1
    commit_blobs_until(table_statistics.FIRST_ANALYZE_AT * table_statistics.ANALYZE_GROWTH)
    assert keeper.passes == 2
    store.close()
    passes = [t for t in threading.enumerate() if t.name == table_statistics.THREAD_NAME]
    assert passes == []  # close waited for the pass that ran
    # Its session ends with it (the server lets a backend go a moment after its client).
    wait_until(
        lambda: (
            postgres_server.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()",
                postgres_url.rsplit("/", 1)[1],
            )
            == [(0,)]
        ),
        what="the store's sessions to end",
    )
    wait_until(lambda: analyses()["blobs"] == 2, what="an ANALYZE")
    # Both passes are over (close waited) and counted (their sessions ended).
    assert (analyses()["forwarded_commands"], analyses()["other_app"]) == (0, 0)
