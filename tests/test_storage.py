"""The SQLite state store: schema checks, blobs, nested transactions, run revisions."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3

import peewee
import pytest

from pi_workflows import plugins
from pi_workflows.builtin import claiming
from pi_workflows.canonical import canonical_bytes, canonical_json, is_json_value
from pi_workflows.errors import (
    BlobConflictError,
    NotFoundError,
    RevisionConflictError,
    SchemaMismatchError,
    TransactionAborted,
)
from pi_workflows.plugin import hookimpl
from pi_workflows.records import RunRecord
from pi_workflows.storage import (
    SCHEMA_NAME,
    SCHEMA_VERSION,
    StateStore,
    open_state,
    put_json,
    put_json_in_parts,
    put_text,
    read_json,
    read_text,
    record_run_change,
    run_claims,
    run_events,
    run_state,
    statements,
    terminal_facts,
)
from pi_workflows.storage.blobs import put_json_in_parts_together
from pi_workflows.storage.models import Blob, Event, NodeAttempt, Run, RunQueue
from pi_workflows.storage.prepared import PreparedQuery, model_instance
from pi_workflows.storage.runs import run_record, run_records, run_status, run_statuses
from pi_workflows.storage.statements import insert_blob, run_sql
from pi_workflows.testing.factories import host_info
from tests.sent_statements import SentStatements


def _file_fingerprint(path):
    info = path.stat()
    return path.read_bytes(), info.st_mtime_ns, info.st_size


# --- schema ----------------------------------------------------------------------------------


@pytest.mark.sqlite_only
@pytest.mark.scenario("1.1", "11.1")
def test_a_new_home_gets_a_private_database_with_schema_meta(store, home_env):
    path = home_env.home.database_path
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    assert oct(home_env.home.root.stat().st_mode & 0o777) == oct(0o700)
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT schema_name, schema_version FROM schema_meta").fetchall()
    assert rows == [(SCHEMA_NAME, SCHEMA_VERSION)]


@pytest.mark.scenario("11.3")
def test_another_schema_version_is_refused_before_any_write(home_env):
    open_state(home_env.home).close()
    path = home_env.home.database_path
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE schema_meta SET schema_version = ?", (SCHEMA_VERSION + 1,))
    connection.close()
    before = _file_fingerprint(path)
    wal = path.with_name(path.name + "-wal")

    with pytest.raises(SchemaMismatchError) as refused:
        open_state(home_env.home)

    message = str(refused.value)
    assert f"v{SCHEMA_VERSION + 1}" in message
    assert "newer than this pi-workflows" in message and "upgrade pi-workflows" in message
    assert _file_fingerprint(path) == before
    assert not wal.exists() or wal.stat().st_size == 0


def test_the_cli_refuses_another_schema_version_with_exit_1(home_env):
    open_state(home_env.home).close()
    assert home_env.run_cli("state", "status").returncode == 0
    path = home_env.home.database_path
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE schema_meta SET schema_version = 0")
    connection.close()
    before = _file_fingerprint(path)

    result = home_env.run_cli("state", "status")

    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "v0" in result.stderr
    assert _file_fingerprint(path) == before


@pytest.mark.scenario("11.3")
def test_a_foreign_sqlite_database_is_refused_untouched(home_env, tmp_path):
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as connection:
        connection.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        connection.execute("INSERT INTO customers (name) VALUES ('ada')")
    connection.close()
    before = _file_fingerprint(foreign)

    with pytest.raises(SchemaMismatchError, match="not a pi-workflows state database"):
        open_state(home_env.home, str(foreign))

    assert _file_fingerprint(foreign) == before
    result = home_env.run_cli("--database", str(foreign), "state", "verify")
    assert result.returncode == 1
    assert "no pi-workflows schema_meta row" in result.stderr
    assert _file_fingerprint(foreign) == before


def test_a_database_path_and_sqlite_url_open_the_same_file(home_env, tmp_path):
    target = tmp_path / "elsewhere.sqlite"
    open_state(home_env.home, f"sqlite:///{target}").close()
    assert target.exists()
    store = open_state(home_env.home, str(target))
    try:
        assert store.location == str(target.resolve())
    finally:
        store.close()
    assert not home_env.home.database_path.exists()


# --- blobs -----------------------------------------------------------------------------------


@pytest.mark.scenario("11.2")
def test_json_and_text_blobs_round_trip_by_content_address(store):
    value = {"b": [1, 2.5, None], "a": "ünïcode", "nested": {"z": True}}
    with store.transaction():
        blob_hash = put_json(value)
        again = put_json({"nested": {"z": True}, "a": "ünïcode", "b": [1, 2.5, None]})
        text_hash = put_text("a prompt\nwith lines")

    assert blob_hash == again == hashlib.sha256(canonical_bytes(value)).hexdigest()
    assert read_json(blob_hash) == value
    assert read_text(text_hash) == "a prompt\nwith lines"
    assert read_json(None) is None and read_text(None) is None
    assert Blob.select().count() == 2


def test_canonical_json_is_the_spec_spelling_and_refuses_what_json_cannot_hold():
    value = {"b": [1, 2.5, -0.0, 1e300, None], "a": "ünïcode \u2028", "é": {"z": True, "y": ""}}
    spec = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    assert canonical_json(value) == spec and canonical_json("x") == '"x"'
    for refused in (float("nan"), float("inf"), {"set": {1}}, object()):
        with pytest.raises((TypeError, ValueError)):
            canonical_json(refused)
    assert canonical_json({"after": "a refusal"}) == '{"after":"a refusal"}'
    assert not is_json_value([float("-inf")]) and is_json_value({"ok": [1]})


def test_large_members_of_split_values_are_stored_once_and_read_back_whole(store):
    big = {"rows": ["x" * 100] * 200}
    first = {"schema": "s", "outputs": {"a": big}, "steps": [{"output": big}]}
    second = {**first, "outputs": {"a": big, "b": {"small": 1}}}
    # A value shaped like the split form itself must still read back as itself.
    lookalike = {"$piw-skeleton": None, "$piw-parts": [[[], "0" * 64]]}
    with store.transaction():
        hashes = [put_json_in_parts(value) for value in (first, second)]
        assert [read_json(h) for h in hashes] == [first, second]
        assert read_json(put_json(lookalike)) == lookalike
        assert read_json(put_json_in_parts({"quoted": lookalike, "big": big})) == {
            "quoted": lookalike,
            "big": big,
        }
    ((stored,),) = store.db.execute_sql("SELECT SUM(byte_length) FROM blobs").fetchall()
    one_copy = len(json.dumps(big, separators=(",", ":")))
    assert stored < 2 * one_copy  # the large list once, plus small skeletons


def test_a_corrupted_blob_is_detected_when_the_value_is_stored_again(store):
    with store.transaction():
        blob_hash = put_json({"answer": 42})
    Blob.update(content=b'{"answer":43}').where(Blob.blob_hash == blob_hash).execute()

    with pytest.raises(BlobConflictError, match=blob_hash[:12]), store.transaction():
        put_json({"answer": 42})


def test_the_blobs_a_transaction_takes_up_are_checked_together_before_it_commits(
    store, monkeypatch
):
    values = [{"taken": number} for number in range(3)]
    with store.transaction():
        stored = [put_json(value) for value in values]
    sent = SentStatements(store, monkeypatch)

    def blob_reads() -> list[str]:
        texts = sent.take()
        return [part for text in texts for part in text.split(";") if "FROM blobs" in part]

    with store.transaction():
        assert [put_json(value) for value in values] == stored  # stored already: taken up
        assert blob_reads() == []  # nothing read yet
    (check,) = blob_reads()
    assert "blob_hash IN (" in check and check.count(",") >= 2 + 3  # three addresses


def test_a_blob_taken_up_on_a_stale_hint_reads_back_in_the_same_transaction(store):
    value = {"pruned": "between two transactions"}
    with store.transaction():
        blob_hash = put_json(value)
    Blob.delete().where(Blob.blob_hash == blob_hash).execute()  # as a prune would

    with store.transaction():
        assert read_json(put_json(value)) == value
    assert read_json(blob_hash) == value


def test_a_corrupted_blob_taken_up_in_a_block_fails_that_block_alone(store):
    with store.transaction():
        corrupted = put_json({"answer": 42})
    Blob.update(content=b'{"answer":43}').where(Blob.blob_hash == corrupted).execute()

    with store.transaction():
        with pytest.raises(BlobConflictError, match=corrupted[:12]), store.savepoint():
            put_json({"answer": 42})
        kept = put_json({"written": "after the failed block"})
    assert read_json(kept) == {"written": "after the failed block"}


def test_a_blob_written_in_a_rolled_back_savepoint_is_written_again(store):
    value = {"kept": "after all"}
    with store.transaction():
        with pytest.raises(RuntimeError), store.savepoint():
            blob_hash = put_json(value)
            raise RuntimeError("this block fails")
        assert put_json(value) == blob_hash

    assert read_json(blob_hash) == value


def test_the_same_bytes_as_text_after_json_are_a_conflict_even_in_one_transaction(store):
    with pytest.raises(BlobConflictError), store.transaction():
        put_json({"a": 1})
        put_text('{"a":1}')
    with store.transaction():
        put_json({"a": 1})
    with pytest.raises(BlobConflictError), store.transaction():
        put_text('{"a":1}')


@pytest.mark.scenario("2.17")
def test_a_blob_of_a_rolled_back_transaction_is_written_again(store):
    value = {"kept": "next time"}
    with pytest.raises(RuntimeError), store.transaction():
        blob_hash = put_json(value)
        raise RuntimeError("this change fails")
    with store.transaction():
        put_json(value)

    assert read_json(blob_hash) == value


def test_a_blob_stored_before_is_stored_again_if_its_row_is_gone(store):
    """Committed addresses are only a hint: the row is looked up, and inserted if absent."""
    with store.transaction():
        blob_hash = put_text("stored once")
    Blob.delete().where(Blob.blob_hash == blob_hash).execute()

    with store.transaction():
        assert put_text("stored once") == blob_hash
        assert put_text("stored once") == blob_hash

    assert read_text(blob_hash) == "stored once"


def test_values_stored_together_are_stored_as_each_alone(store):
    big = {"rows": ["y" * 100] * 100}
    values = [{"a": 1}, {"state": big, "n": 2}, {"a": 1}, {"b": [2]}]
    with store.transaction():
        hashes = put_json_in_parts_together(values)
    with store.transaction():
        assert hashes == [put_json_in_parts(value) for value in values]
        assert put_json_in_parts_together([{"b": [2]}, {"c": 3}]) == [hashes[3], put_json({"c": 3})]

    assert [read_json(blob_hash) for blob_hash in hashes] == values
    assert Blob.select().where(Blob.blob_hash.in_(hashes)).count() == 3


def test_values_stored_together_still_catch_a_corrupted_row(store):
    # Stored by another writer: this process has not seen the address yet.
    corrupted = json.dumps({"answer": 42}, separators=(",", ":")).encode()
    address = hashlib.sha256(corrupted).hexdigest()
    with store.transaction():
        insert_blob(address, "application/json", b'{"answer":43}', 1)

    with pytest.raises(BlobConflictError, match=address[:12]), store.transaction():
        put_json_in_parts_together([{"answer": 42}, {"fresh": True}])
    with store.transaction():
        with pytest.raises(RuntimeError), store.savepoint():
            (fresh, other) = put_json_in_parts_together([{"fresh": True}, {"other": 1}])
            raise RuntimeError("this block fails")
        put_json_in_parts_together([{"fresh": True}, {"other": 1}])

    assert read_json(fresh) == {"fresh": True} and read_json(other) == {"other": 1}


def test_reading_a_missing_blob_or_the_wrong_media_type_fails(store):
    with store.transaction():
        text_hash = put_text("plain")
    with pytest.raises(BlobConflictError, match="missing"):
        read_json("f" * 64)
    with pytest.raises(BlobConflictError, match="expected application/json"):
        read_json(text_hash)


# --- transactions ----------------------------------------------------------------------------


@pytest.mark.scenario("2.17")
def test_an_inner_failure_dooms_the_outer_transaction(store, make_run):
    with pytest.raises(TransactionAborted), store.transaction():
        make_run("outer-run")
        try:
            with store.transaction():
                make_run("inner-run")
                raise ValueError("inner step failed")
        except ValueError:
            pass  # the caller swallows the error; the transaction must still roll back

    assert Run.select().count() == 0
    assert Event.select().count() == 0
    assert not store.in_transaction


@pytest.mark.scenario("2.17")
def test_an_outer_failure_rolls_back_a_successful_inner_block(store, make_run):
    with pytest.raises(RuntimeError, match="after inner"), store.transaction():
        with store.transaction():
            make_run("inner-ok")
        assert Run.select().count() == 1  # visible inside the transaction
        raise RuntimeError("after inner")

    assert Run.select().count() == 0
    assert RunQueue.select().count() == 0


def test_nested_blocks_commit_together_and_after_commit_runs_once(store, make_run):
    committed = []
    with store.transaction():
        make_run("first")
        with store.transaction():
            make_run("second")
            store.after_commit(lambda: committed.append("inner"))
        store.after_commit(lambda: committed.append("outer"))
        assert committed == []

    assert committed == ["inner", "outer"]
    assert sorted(run.run_id for run in Run.select()) == ["first", "second"]


def test_after_commit_callbacks_are_dropped_on_rollback(store, make_run):
    committed = []
    with pytest.raises(KeyError), store.transaction():
        store.after_commit(lambda: committed.append("never"))
        raise KeyError("boom")
    with store.transaction():
        make_run("later")
    assert committed == []


def test_a_failed_transaction_leaves_the_store_usable(store, make_run):
    with pytest.raises(TransactionAborted), store.transaction():
        try:
            with store.transaction():
                raise ValueError("x")
        except ValueError:
            pass
    with store.transaction():
        make_run("afterwards")
    assert Run.get_by_id("afterwards").revision == 1


@pytest.mark.sqlite_only
def test_transactions_take_the_sqlite_write_lock_up_front(store, home_env):
    other = sqlite3.connect(home_env.home.database_path, timeout=0)
    try:
        with store.transaction():
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
    finally:
        other.close()


# --- run revisions ---------------------------------------------------------------------------


@pytest.mark.scenario("11.12", "2.16")
def test_each_run_change_bumps_the_revision_once_and_appends_one_event(store, make_run):
    with store.transaction():
        make_run("rev-run")
    with store.transaction():
        second = record_run_change(
            "rev-run", event_type="run.started", actor="host", status="running"
        )
    with store.transaction():
        third = record_run_change(
            "rev-run",
            event_type="run.completed",
            actor="worker",
            payload={"output": 1},
            expected_revision=2,
            lease_generation=1,
            status="completed",
        )

    assert (second, third) == (2, 3)
    assert run_record("rev-run").revision == 3
    events = run_events("rev-run")
    assert [(e.revision, e.event_type, e.actor) for e in events] == [
        (1, "run.created", "test"),
        (2, "run.started", "host"),
        (3, "run.completed", "worker"),
    ]
    assert events[2].payload == {"output": 1} and events[2].lease_generation == 1


def test_a_transaction_names_the_revision_it_wrote_without_reading_it_back(
    store, make_run, monkeypatch
):
    from pi_workflows.storage import runs

    with store.transaction():
        make_run("named-run")
        record_run_change("named-run", event_type="run.started", actor="host", status="running")
        # Read from the database, this raises: the write's own RETURNING answers instead.
        with monkeypatch.context() as patch:
            patch.setattr(runs, "_RUN_REVISION", None)
            assert runs.current_revision("named-run") == 2
        # A savepoint that wrote and rolled back leaves the revision the database holds.
        with pytest.raises(RuntimeError), store.savepoint():
            record_run_change("named-run", event_type="run.paused", actor="host")
            assert runs.current_revision("named-run") == 3
            raise RuntimeError("this block fails")
        assert runs.current_revision("named-run") == 2
    # Outside any transaction the database answers (another process may have written).
    with store.transaction():
        record_run_change("named-run", event_type="run.paused", actor="host")
    assert runs.current_revision("named-run") == run_record("named-run").revision == 3


@pytest.mark.scenario("2.12", "2.14")
def test_a_stale_expected_revision_changes_nothing(store, make_run):
    with store.transaction():
        make_run("stale-run")
        record_run_change("stale-run", event_type="run.started", actor="host", status="running")

    with pytest.raises(RevisionConflictError, match="revision 2, not 1"), store.transaction():
        record_run_change(
            "stale-run",
            event_type="run.cancelled",
            actor="cli",
            expected_revision=1,
            status="cancelled",
        )

    run = Run.get_by_id("stale-run")
    assert (run.status, run.revision) == ("running", 2)
    assert Event.select().where(Event.run == "stale-run").count() == 2


@pytest.mark.scenario("2.16")
def test_changing_a_missing_run_is_not_found(store):
    with pytest.raises(NotFoundError, match="ghost"), store.transaction():
        record_run_change("ghost", event_type="run.started", actor="host")


# --- prepared queries ------------------------------------------------------------------------


def test_a_prepared_query_is_built_once_and_runs_with_fresh_arguments(store, make_run):
    builds = []

    def build(p):
        builds.append(p)
        # A constant ("queued") stays in the statement; the run id is an argument.
        return RunQueue.select(RunQueue.priority).where(
            (RunQueue.run == p.run_id) & (RunQueue.status == "queued")
        )

    priority = PreparedQuery(build)
    with store.transaction():
        make_run("prepared-a", priority=3)
        make_run("prepared-b", priority=-2)

    assert priority.scalar(run_id="prepared-a") == 3
    assert priority.rows(run_id="prepared-b") == [(-2,)]
    assert priority.first(run_id="missing") is None
    assert len(builds) == 1
    placeholder = "?" if store.is_sqlite else "%s"
    assert priority.sql().count(placeholder) == 2


def test_a_prepared_update_reports_the_rows_it_changed(store, make_run):
    pause = PreparedQuery(
        lambda p: Run.update(paused=p.paused, updated_at=p.now).where(
            Run.run_id.in_(("prepared-c", "prepared-d")) & (Run.status == p.status)
        )
    )
    with store.transaction():
        make_run("prepared-c")
        make_run("prepared-d")
        make_run("prepared-e")
        assert pause.changed(paused=True, now=7, status="queued") == 2
        assert pause.changed(paused=True, now=8, status="running") == 0

    paused = {run.run_id: (run.paused, run.updated_at) for run in Run.select()}
    assert paused["prepared-c"] == paused["prepared-d"] == (True, 7)
    assert paused["prepared-e"][0] is False


def test_a_prepared_read_of_a_whole_row_gives_the_model_object(store, make_run):
    with store.transaction():
        make_run("prepared-f", input={"name": "x"})
    whole_run = PreparedQuery(lambda p: Run.select().where(Run.run_id == p.run_id))

    run = model_instance(Run, whole_run.first(run_id="prepared-f"))

    stored = Run.get_by_id("prepared-f")
    assert run.__data__ == stored.__data__
    assert run.paused is False and read_json(run.input_hash) == {"name": "x"}


def test_a_prepared_join_gives_the_selected_models_rows_in_order(store, make_run):
    with store.transaction():
        for run_id, priority in (("prepared-g", 1), ("prepared-h", 5), ("prepared-i", 3)):
            make_run(run_id, priority=priority)
    # The shape of the host's poll reads: one model's fields, joined and filtered.
    by_priority = PreparedQuery(
        lambda p: (
            Run.select(Run)
            .join(RunQueue, on=(RunQueue.run == Run.run_id))
            .where((RunQueue.priority >= p.lowest) & Run.run_id.startswith("prepared-"))
            .order_by(RunQueue.priority.desc())
        )
    )

    runs = by_priority.models(Run, lowest=2)

    assert [run.run_id for run in runs] == ["prepared-h", "prepared-i"]
    assert [run.__data__ for run in runs] == [
        Run.get_by_id(run_id).__data__ for run_id in ("prepared-h", "prepared-i")
    ]
    assert by_priority.models(Run, lowest=9) == []


# --- run records -----------------------------------------------------------------------------


def test_run_records_decode_input_and_options_when_read_and_equal_built_records(store, make_run):
    with store.transaction():
        make_run("record-a", input={"pick": [1, 2]}, launch_options={"humanDecision": "ship"})
        make_run("record-b", input=None, presentation_prompt="Say it briefly.")

    first, second = run_records(["record-b", "missing", "record-a"])

    # Left encoded until read: building a claim pass's candidates decodes nothing.
    assert "input" not in vars(first) and "launch_options" not in vars(second)
    assert second.input == {"pick": [1, 2]} and "input" in vars(second)
    assert second.launch_options == {"humanDecision": "ship"}
    assert first.input is None and first.launch_options == {}
    assert first.presentation_prompt == "Say it briefly."
    built = RunRecord(**{f.name: getattr(second, f.name) for f in dataclasses.fields(RunRecord)})
    assert built == run_records(["record-a"])[0] and repr(built) == repr(second)
    assert dataclasses.replace(second, priority=3).input == {"pick": [1, 2]}
    assert dataclasses.asdict(run_records(["record-b"])[0])["launch_options"] == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        second.input = {}  # type: ignore[misc]


def test_claim_candidates_come_in_the_builtin_selections_order(store, make_run):
    """A host without a selection plugin takes the first candidate of a one-run window as
    the built-in's answer: it must be what the built-in picks from the whole window."""
    with store.transaction():
        for index, priority in enumerate([0, 2, 0, 2, 1, 0]):
            make_run(f"order-{index}", priority=priority)
        # Ties on priority broken by availability, then age, then id. Set, not shifted: the
        # runs were made at whatever pace the machine allowed.
        RunQueue.update(available_at=5_000).where(RunQueue.run.startswith("order-")).execute()
        RunQueue.update(available_at=4_950).where(
            RunQueue.run.in_(["order-3", "order-5"])
        ).execute()
        RunQueue.update(available_at=1_000, created_at=2).where(
            RunQueue.run.in_(["order-0", "order-2"])
        ).execute()
        RunQueue.update(created_at=1).where(RunQueue.run == "order-2").execute()
        Run.update(created_at=2).where(Run.run_id == "order-0").execute()
        Run.update(created_at=1).where(Run.run_id == "order-2").execute()

    taken: set[str] = set()
    order = []
    while window := run_claims.claim_candidates("host-a", taken):
        builtin_choice = claiming.piw_select_run_to_claim(run_records(window), host_info())
        assert run_claims.claim_candidates("host-a", taken, limit=1) == [builtin_choice.run_id]
        order.append(builtin_choice.run_id)
        taken.add(builtin_choice.run_id)
    assert order == ["order-3", "order-1", "order-4", "order-2", "order-0", "order-5"]


def test_candidate_pages_continue_where_the_last_page_stopped(store, make_run):
    """A claim pass reads a long queue in pages, each `after` the last one's place: the
    pages together are the whole queue in the built-in selection's order, each run once,
    runs tied on everything but the id included (ids compare by code point on both
    backends, whatever the server's collation)."""
    ids = ["tie-b", "tie-B", "tie_a", "tie-a", "tie.a", "tie-A1", "solo", "late", "high"]
    with store.transaction():
        for run_id in ids:
            make_run(run_id, priority=5 if run_id == "high" else 0)
        RunQueue.update(available_at=1_000, created_at=7).where(
            RunQueue.run.startswith("tie")
        ).execute()
        RunQueue.update(available_at=1_000, created_at=3).where(RunQueue.run == "solo").execute()
        RunQueue.update(available_at=2_000).where(RunQueue.run == "late").execute()
        # The built-in selection reads a run's `created_at`; the queue row keeps a copy.
        Run.update(created_at=7).where(Run.run_id.startswith("tie")).execute()
        Run.update(created_at=3).where(Run.run_id == "solo").execute()

    whole = run_claims.candidate_revisions(set(), 100)
    builtin_order = sorted(
        run_records(ids),
        key=lambda run: (-run.priority, run.available_at, run.created_at, run.run_id),
    )
    assert [c.run_id for c in whole] == [run.run_id for run in builtin_order]
    assert [c.run_id for c in whole][:3] == ["high", "solo", "tie-A1"]

    for size in (1, 2, 4):
        pages, place = [], None
        while page := run_claims.candidate_revisions(set(), size, after=place):
            pages.append([c.run_id for c in page])
            place = page[-1].place
        assert [run_id for page in pages for run_id in page] == [c.run_id for c in whole]
        assert all(len(page) == size for page in pages[:-1])

    # A run excluded (busy in this host) is skipped without ending the page early.
    after_solo = run_claims.candidate_revisions({"tie-B"}, 3, after=whole[1].place)
    assert [c.run_id for c in after_solo] == ["tie-A1", "tie-a", "tie-b"]


def test_run_status_gives_the_spec_object_with_output_and_error_decoded(store, make_run):
    with store.transaction():
        make_run("status-a", priority=2)
        record_run_change(
            "status-a",
            event_type="run.completed",
            actor="test",
            status="failed",
            final_output_hash=put_json({"partial": [1]}),
            error_hash=put_text("it broke"),
        )

    status = run_status("status-a")

    assert status == {
        "runId": "status-a",
        "workflowName": "hello",
        "status": "failed",
        "queueStatus": "queued",
        "paused": False,
        "statusDetail": None,
        "errorCode": None,
        "finalOutput": {"partial": [1]},
        "error": "it broke",
        "parentRunId": None,
        "restartNumber": 0,
        "revision": 2,
        "priority": 2,
        "executionMode": "headless",
        "continuation": None,
        "createdAt": status["createdAt"],
        "updatedAt": status["updatedAt"],
    }
    assert status["paused"] is False and status["updatedAt"] >= status["createdAt"]
    assert run_statuses(5) == [status]


# --- running statements ----------------------------------------------------------------------


class _RecordingDatabase(peewee.SqliteDatabase):
    """A plugin's database that changes how statements run."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []

    def execute_sql(self, sql, params=None):
        self.seen.append(sql)
        return super().execute_sql(sql, params)


def test_statements_reach_a_database_that_overrides_execute_sql_and_query_hooks():
    recording = _RecordingDatabase(":memory:")
    assert run_sql(recording, "SELECT ?", [1]).fetchall() == [(1,)]
    assert recording.seen == ["SELECT ?"]

    plain = peewee.SqliteDatabase(":memory:")
    events: list[peewee.QueryEvent] = []
    plain.query_hooks.append(events.append)
    assert run_sql(plain, "SELECT ? + 1", [1]).fetchall() == [(2,)]
    assert [event.sql for event in events] == ["SELECT ? + 1"]

    plain.query_hooks.clear()
    assert run_sql(plain, "SELECT 3", []).fetchall() == [(3,)]
    assert len(events) == 1
    with pytest.raises(peewee.OperationalError, match="no such table"):
        run_sql(plain, "SELECT * FROM missing", [])


@pytest.mark.scenario("11.4")
def test_a_read_only_store_cannot_write(home_env, database_url, make_run):
    """Readers cannot write (issue 22.6): the database itself refuses every write of a
    read-only store, whatever code path tries one."""
    writer = open_state(home_env.home, database_url)
    with writer.transaction():
        make_run("kept")
    writer.close()

    reader = open_state(home_env.home, database_url, read_only=True)
    try:
        assert run_record("kept").status == "queued"
        if reader.is_sqlite:
            assert reader.db.execute_sql("PRAGMA query_only").fetchone() == (1,)
        with pytest.raises(peewee.DatabaseError, match="read-only|readonly"):
            with reader.transaction():
                reader.db.execute_sql("DELETE FROM events")
        with pytest.raises(peewee.DatabaseError, match="read-only|readonly"):
            with reader.transaction():
                put_text("not stored")
    finally:
        reader.close()
    writer = open_state(home_env.home, database_url)
    try:
        assert [e.event_type for e in run_events("kept")] == ["run.created"]
        assert Blob.select().where(Blob.content == b"not stored").count() == 0
    finally:
        writer.close()


def test_state_verify_reads_one_snapshot_while_a_host_commits(
    home_env, store, make_run, database_url, monkeypatch
):
    # Found by the model test (tests/model/): `state verify` beside a live host reported
    # "revision 1 but 2 events" for a run the host changed between its two reads.
    from pi_workflows.storage import maintenance

    with store.transaction():
        make_run("busy-run")
    store.close()
    reader = open_state(home_env.home, database_url, read_only=True)
    select = Event.select
    writes = []

    def host_commits_meanwhile(*args, **kwargs):
        if not writes:  # the run's next change, committed by another connection
            writes.append(_commit_next_revision(home_env, database_url, "busy-run"))
        return select(*args, **kwargs)

    monkeypatch.setattr(maintenance.Event, "select", host_commits_meanwhile)
    try:
        problems = maintenance.state_verify(reader)
    finally:
        reader.close()

    assert writes and problems == []


def _commit_next_revision(home_env, database_url: str | None, run_id: str) -> None:
    statements = (
        "INSERT INTO events (run_id, revision, event_type, actor, lease_generation, "
        "payload_hash, recorded_at) SELECT run_id, 2, event_type, actor, lease_generation, "
        f"payload_hash, recorded_at FROM events WHERE run_id = '{run_id}' AND revision = 1",
        f"UPDATE runs SET revision = 2 WHERE run_id = '{run_id}'",
    )
    if database_url is None:
        connection = sqlite3.connect(home_env.home.database_path)
    else:
        import psycopg2

        connection = psycopg2.connect(database_url)
    try:
        cursor = connection.cursor()
        for statement in statements:
            cursor.execute(statement)
        connection.commit()
    finally:
        connection.close()


def test_run_statuses_page_newest_first_and_filter_by_status_and_workflow(store, make_run):
    with store.transaction():
        for index in range(5):
            make_run(f"run-{index}", workflow_name="even" if index % 2 == 0 else "odd")
        Run.update(created_at=1000).execute()  # one instant: the run id orders them
        Run.update(status="completed").where(Run.run_id.in_(["run-1", "run-4"])).execute()

    first = [s["runId"] for s in run_statuses(2)]
    second = [s["runId"] for s in run_statuses(2, before=first[-1])]
    last = [s["runId"] for s in run_statuses(2, before=second[-1])]

    assert (first, second, last) == (["run-4", "run-3"], ["run-2", "run-1"], ["run-0"])
    assert [s["runId"] for s in run_statuses(10, workflow="odd")] == ["run-3", "run-1"]
    assert [s["runId"] for s in run_statuses(10, status="completed", before="run-4")] == ["run-1"]
    with pytest.raises(NotFoundError):
        run_statuses(2, before="no-such-run")


# --- node attempts kept in step with snapshots ------------------------------------------


def _snapshot(run_id: str, current: str | None, *, done: list[str] = ()) -> dict:
    """A running run's snapshot: the steps `done` (attempt ids of node `n-<id>`) and the
    attempt `current` in flight."""
    snapshot = {
        "schema": run_state.RUN_STATE_SCHEMA,
        "runId": run_id,
        "status": "running",
        "steps": [
            {
                "attemptId": attempt,
                "nodeId": f"n-{attempt}",
                "nodeType": "compute",
                "outcome": "ok",
                "output": {},
                "startedAt": 1,
                "finishedAt": 2,
            }
            for attempt in done
        ],
    }
    if current is not None:
        snapshot.update(
            currentAttemptId=current,
            currentNode=f"n-{current}",
            currentNodeType="compute",
            currentNodeStartedAt=3,
        )
    return snapshot


def _write(store: StateStore, run_id: str, snapshot: dict) -> int:
    with store.transaction():
        return run_state.write_snapshot(run_id, snapshot, {"type": "node.started"})


def _attempts(run_id: str) -> dict[str, tuple[str, int | None]]:
    return {
        row.attempt_id: (row.status, row.finished_at)
        for row in NodeAttempt.select().where(NodeAttempt.run == run_id)
    }


def _other_writer(store: StateStore, database_url: str | None, sql: list[str]) -> None:
    """`sql` committed over a connection of its own, as another host would."""
    if database_url is None:
        with sqlite3.connect(store.home.database_path) as connection:
            for statement in sql:
                connection.execute(statement)
        return
    import psycopg2

    connection = psycopg2.connect(database_url)
    try:
        with connection, connection.cursor() as cursor:
            for statement in sql:
                cursor.execute(statement)
    finally:
        connection.close()


def test_a_snapshot_write_sees_attempts_another_writer_changed(store, make_run, database_url):
    with store.transaction():
        make_run("r-1")
    _write(store, "r-1", _snapshot("r-1", "a-1"))
    # Another host interrupts the attempt, bumping the revision as every such change does.
    _other_writer(
        store,
        database_url,
        [
            "UPDATE node_attempts SET status = 'interrupted', finished_at = 123 "
            "WHERE attempt_id = 'a-1'",
            "UPDATE runs SET revision = revision + 1 WHERE run_id = 'r-1'",
        ],
    )

    _write(store, "r-1", _snapshot("r-1", "a-2"))

    # a-1 was no longer active: left as the other host left it, not interrupted again.
    assert _attempts("r-1") == {"a-1": ("interrupted", 123), "a-2": ("running", None)}


def test_attempts_of_a_rolled_back_snapshot_are_not_taken_for_stored_ones(store, make_run):
    with store.transaction():
        make_run("r-1")
    _write(store, "r-1", _snapshot("r-1", "a-1"))
    with pytest.raises(RuntimeError), store.transaction():
        run_state.write_snapshot(
            "r-1", _snapshot("r-1", "a-2", done=["a-1"]), {"type": "node.started"}
        )
        raise RuntimeError("the commit group's next step failed")
    with store.transaction():  # a change that leaves the attempts alone
        record_run_change("r-1", event_type="lease.claimed", actor="host")

    _write(store, "r-1", _snapshot("r-1", "a-3"))

    attempts = _attempts("r-1")
    assert attempts["a-1"][0] == "interrupted" and "a-2" not in attempts
    assert attempts["a-3"] == ("running", None)


class _AttemptListener:
    def __init__(self) -> None:
        self.heard: list[tuple[str, str]] = []

    @hookimpl
    def piw_node_attempt_started(self, attempt):
        self.heard.append(("started", attempt.attempt_id))

    @hookimpl
    def piw_node_attempt_finished(self, attempt):
        self.heard.append(("finished", attempt.attempt_id))


def test_a_commit_reads_its_node_attempts_back_only_when_a_plugin_listens(
    store, make_run, monkeypatch, plugin_env
):
    plugin_env.setenv(plugins.DISABLE_ENV, "otel")  # the installed plugin that listens
    plugins.reload()
    assert not plugins.node_attempts_heard()
    reads: list[list[str]] = []
    read_announced = statements.commit_rows

    def commit_rows(run_ids, attempt_ids, blob_hashes):
        reads.append(attempt_ids)
        return read_announced(run_ids, attempt_ids, blob_hashes)

    monkeypatch.setattr(statements, "commit_rows", commit_rows)
    with store.transaction():
        make_run("r-1")
    _write(store, "r-1", _snapshot("r-1", "a-1"))
    assert reads == [[], []]  # nobody hears of a-1 starting: it is not read

    listener = _AttemptListener()
    with plugins.temporary_plugin(listener):
        _write(store, "r-1", _snapshot("r-1", "a-2", done=["a-1"]))

    assert reads[2:] == [["a-1", "a-2"]]  # with the run's lifecycle, in one read
    assert listener.heard == [("finished", "a-1"), ("started", "a-2")]


def test_one_commit_records_the_announced_status_of_each_of_its_runs(store, make_run):
    # More runs than one statement records (ANNOUNCED_PER_STATEMENT), of two statuses.
    with store.transaction():
        for number in range(300):
            make_run(f"r-{number:03}")
        for number in range(0, 300, 3):
            record_run_change(
                f"r-{number:03}", event_type="run.cancelled", actor="test", status="cancelled"
            )

    announced = {run.run_id: run.announced_status for run in Run.select()}
    assert announced == {
        f"r-{number:03}": "cancelled" if number % 3 == 0 else "queued" for number in range(300)
    }


def test_a_run_the_transaction_holds_is_bumped_without_an_answer_and_its_history_stays_exact(
    store, make_run
):
    """After its first bump (or a read that holds the row, `note_held`) a transaction
    knows the run's revision: its next bumps send nothing back, and an expected revision
    is checked against what it knows."""
    with store.transaction():
        make_run("held-run")
    with store.transaction():
        assert record_run_change("held-run", event_type="run.started", actor="t") == 2
        assert record_run_change("held-run", event_type="node.started", actor="t") == 3
        with pytest.raises(RevisionConflictError, match="at revision 3, not 2"):
            record_run_change("held-run", event_type="node.started", actor="t", expected_revision=2)
        third = record_run_change(
            "held-run", event_type="node.finished", actor="t", expected_revision=3, status="running"
        )
    assert third == 4
    assert (run_record("held-run").revision, run_record("held-run").status) == (4, "running")
    assert [e.revision for e in run_events("held-run")] == [1, 2, 3, 4]


def test_a_held_bump_whose_revision_was_taken_meanwhile_fails_its_transaction(store, make_run):
    """Were the run's revision to move behind the transaction's back, the held bump's
    event would find its (run, revision) taken: the transaction fails, nothing of it
    stays, and the history is not rewritten."""
    with store.transaction():
        make_run("moved-run")
    with pytest.raises(peewee.IntegrityError), store.transaction():
        record_run_change("moved-run", event_type="run.started", actor="t")
        # A bump the transaction does not know of (none of the store's writes does this).
        Run.update(revision=Run.revision + 1).where(Run.run_id == "moved-run").execute()
        Event.insert(
            run="moved-run",
            revision=3,
            event_type="x",
            actor="x",
            payload_hash="0" * 64,
            recorded_at=1,
        ).execute()
        record_run_change("moved-run", event_type="node.started", actor="t")
        run_record("moved-run")  # the next statement: the held bump goes with it
    assert run_record("moved-run").revision == 1
    assert [e.revision for e in run_events("moved-run")] == [1]


def test_a_run_without_a_snapshot_has_the_state_its_record_and_launch_envelope_hold(
    store, make_run
):
    """worker.ready's answer prepared at launch builds a new run's state from what the
    host holds (`unstarted_run_state`) instead of reading it: the same state."""
    with store.transaction():
        make_run(
            "fresh-run",
            input={"name": "Ada", "items": [1, 2]},
            execution_mode="interactive",
            origin_session_id="session-1",
        )
    run = Run.get_by_id("fresh-run")
    held = run_state.unstarted_run_state(
        run_record("fresh-run"), json.loads(run.workflow_source), run.definition_digest
    )
    assert held == run_state.read_run_state("fresh-run")


def test_whether_a_run_can_need_a_terminal_message_is_known_once_its_row_was_written_or_read(
    store, make_run, monkeypatch
):
    """Every run's stop asks whether the run can need a terminal message (interactive,
    with an origin session: neither ever changes). For a run this process created or read,
    the answer costs no statement."""
    sent = SentStatements(store, monkeypatch)
    with store.transaction():
        make_run("kind-headless")
        make_run("kind-interactive", execution_mode="interactive", origin_session_id="session-1")
    sent.take()
    assert terminal_facts.is_required("kind-headless", once_terminal=True) is False
    assert terminal_facts.is_required("kind-interactive", once_terminal=True) is True
    assert sent.take() == []

    # Runs this process never saw (another host's, or from before a restart): read once.
    monkeypatch.setattr(terminal_facts, "_interactive", {})
    assert terminal_facts.is_required("kind-interactive", once_terminal=True) is True
    assert len(sent.take()) == 1
    assert terminal_facts.is_required("kind-interactive", once_terminal=True) is True
    assert sent.take() == []
    # A record read (a claim's, a hook's) tells too.
    run_record("kind-headless")
    sent.take()
    assert terminal_facts.is_required("kind-headless", once_terminal=True) is False
    assert sent.take() == []
    # Whether it needs one now still reads the run's statuses.
    assert terminal_facts.is_required("kind-interactive") is False  # (queued, not terminal)
    assert len(sent.take()) == 1
