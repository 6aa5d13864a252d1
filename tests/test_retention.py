"""Pruning finished lineages (storage.retention): what goes, what stays, and its blobs."""

from __future__ import annotations

import threading

import pytest

from pi_workflows.clock import now_ms
from pi_workflows.storage import put_json, put_json_in_parts
from pi_workflows.storage.blobs import PART_MIN_BYTES
from pi_workflows.storage.maintenance import state_verify
from pi_workflows.storage.models import (
    Blob,
    Effect,
    Event,
    HumanDecision,
    NestedBlob,
    Run,
    RunQueue,
    RunWorker,
    WorkflowMessage,
)
from pi_workflows.storage.retention import DAY_MS, prune
from pi_workflows.storage.revisions import record_run_change
from pi_workflows.storage.run_state import record_transcript
from tests.polling import wait_until

OLD = now_ms() - 40 * DAY_MS
CUTOFF = now_ms() - 30 * DAY_MS


def _finish(run_id: str, at: int, status: str = "completed") -> None:
    Run.update(status=status, finished_at=at, updated_at=at).where(Run.run_id == run_id).execute()
    RunQueue.update(status="done", finished_at=at).where(RunQueue.run == run_id).execute()


def _finished_run(make_run, run_id: str, at: int = OLD, **options) -> str:
    make_run(run_id, **options)
    _finish(run_id, at)
    return run_id


def _restart(make_run, run_id: str, parent: str, root: str) -> str:
    return make_run(run_id, parent_run_id=parent, root_run_id=root, lineage_kind="restart")


def _exists(run_id: str) -> bool:
    return Run.get_or_none(Run.run_id == run_id) is not None


def test_an_old_lineage_goes_whole_with_its_events_and_blobs_and_the_state_stays_sound(
    store, make_run
):
    with store.transaction():
        _finished_run(make_run, "root")
        _restart(make_run, "restart-1", "root", "root")
        _finish("restart-1", OLD + 1000, "failed")
        make_run(
            "cont-1", parent_run_id="restart-1", root_run_id="root", lineage_kind="continuation"
        )
        _finish("cont-1", OLD + 2000)
        record_transcript(
            "root", {"nodeId": "a", "attemptId": "a-1", "entries": [{"kind": "text"}]}
        )
        _finished_run(make_run, "recent", at=now_ms() - DAY_MS)
    blobs_before = Blob.select().count()

    report = prune(store, CUTOFF, apply=True)

    assert not any(map(_exists, ("root", "restart-1", "cont-1")))
    assert _exists("recent")
    assert Event.select().where(Event.run.in_(["root", "restart-1", "cont-1"])).count() == 0
    assert (report.runs, report.lineages, report.events, report.transcripts) == (3, 1, 4, 1)
    assert report.blobs > 0 and report.bytes > 0
    assert Blob.select().count() == blobs_before - report.blobs
    assert state_verify(store) == []


def test_a_lineage_goes_only_after_its_last_run_finished_before_the_cut_off(store, make_run):
    with store.transaction():
        _finished_run(make_run, "root")
        _restart(make_run, "restart-1", "root", "root")
        _finish("restart-1", now_ms() - DAY_MS)

    report = prune(store, CUTOFF, apply=True)

    assert _exists("root") and _exists("restart-1")
    assert report.runs == 0


def _unfinished_restart(run_id: str, make_run) -> None:
    _restart(make_run, f"{run_id}-restart", run_id, Run.get_by_id(run_id).root_run_id)


def _pending_decision(run_id: str, make_run) -> None:
    HumanDecision.insert(
        decision_id=f"{run_id}-decision",
        run=run_id,
        attempt_id="a-1",
        node_id="ask",
        audience="default",
        request_hash=put_json({}),
        request_digest="sha256:" + "0" * 64,
        status="pending",
        created_at=OLD,
        updated_at=OLD,
    ).execute()


def _unsettled_effect(run_id: str, make_run) -> None:
    Effect.insert(
        effect_id=f"{run_id}-effect",
        run=run_id,
        scope="run",
        effect_type="notify",
        idempotency_key="k",
        policy="manual",
        status="ambiguous",
        created_at=OLD,
        updated_at=OLD,
    ).execute()


def _undelivered_terminal_message(run_id: str, make_run) -> None:
    WorkflowMessage.insert(
        workflow_message_id=f"{run_id}-message",
        run=run_id,
        target_session_id="session",
        kind="terminal",
        source_id=run_id,
        idempotency_key="k",
        content_hash=put_json({}),
        order_number=1,
        status="pending",
        created_at=OLD,
        updated_at=OLD,
    ).execute()


def _live_worker(run_id: str, make_run) -> None:
    RunWorker.insert(
        worker_epoch=f"{run_id}-worker",
        run=run_id,
        generation=1,
        host_epoch=1,
        launch_envelope_hash=put_json({}),
        launch_progress_revision=1,
        status="running",
        started_at=OLD,
    ).execute()


@pytest.mark.parametrize(
    "protection",
    [
        _unfinished_restart,
        _pending_decision,
        _unsettled_effect,
        _undelivered_terminal_message,
        _live_worker,
    ],
)
def test_a_protected_lineage_stays_whole_while_an_unprotected_one_goes(store, make_run, protection):
    with store.transaction():
        _finished_run(make_run, "kept")
        _restart(make_run, "kept-restart", "kept", "kept")
        _finish("kept-restart", OLD)
        protection("kept-restart", make_run)
        _finished_run(make_run, "gone")

    report = prune(store, CUTOFF, apply=True)

    assert _exists("kept") and _exists("kept-restart")
    assert not _exists("gone")
    # An unfinished lineage is not a candidate at all; the others are counted as protected.
    assert report.runs == 1
    assert report.protected == (0 if protection is _unfinished_restart else 1)


def test_an_unfinished_run_is_never_pruned(store, make_run):
    with store.transaction():
        make_run("queued")
        Run.update(updated_at=OLD, created_at=OLD).execute()

    assert prune(store, now_ms(), apply=True).runs == 0
    assert _exists("queued")


def test_blobs_a_kept_run_shares_survive_and_read_back(store, make_run):
    big = {"text": "x" * (2 * PART_MIN_BYTES)}
    with store.transaction():
        _finished_run(make_run, "gone", input={"shared": True})
        record_run_change("gone", event_type="step", actor="test", payload={"out": big, "n": 1})
        _finished_run(make_run, "kept", at=now_ms(), input={"shared": True})
        kept_state = put_json_in_parts({"out": big, "n": 2})
        Run.update(state_hash=kept_state).where(Run.run_id == "kept").execute()
    shared_input = Run.get_by_id("kept").input_hash

    report = prune(store, CUTOFF, apply=True)

    assert report.runs == 1 and report.blobs > 0
    assert Blob.get_or_none(Blob.blob_hash == shared_input) is not None
    from pi_workflows.storage import read_json

    assert read_json(kept_state) == {"out": big, "n": 2}
    assert state_verify(store) == []


def test_a_dry_run_changes_nothing_and_a_repeated_prune_is_a_no_op(store, make_run):
    with store.transaction():
        for index in range(3):
            _finished_run(make_run, f"old-{index}")
    counts = (Run.select().count(), Event.select().count(), Blob.select().count())

    dry = prune(store, CUTOFF, apply=False)

    assert (Run.select().count(), Event.select().count(), Blob.select().count()) == counts
    applied = prune(store, CUTOFF, apply=True)
    assert (dry.applied, applied.applied) == (False, True)
    assert dry.as_json() | {"applied": True} == applied.as_json()
    again = prune(store, CUTOFF, apply=True)
    assert (again.runs, again.events, again.blobs) == (0, 0, 0)
    assert Run.select().count() == 0


def test_an_existing_database_gets_the_indexes_it_lacks_when_opened(store, home_env, database_url):
    """A database made before the added indexes (partial ones too, whose WHERE SQLite
    takes only without parameters) gets each of them when it is opened for writing."""
    from pi_workflows.storage import open_state
    from pi_workflows.storage.models import ADDED_INDEXES

    for _, index in ADDED_INDEXES:
        store.db.execute_sql(f"DROP INDEX {index._name}")
    store.close()
    reopened = open_state(home_env.home, database_url)
    try:
        for model, index in ADDED_INDEXES:
            table = model._meta.table_name
            assert index._name in {found.name for found in reopened.db.get_indexes(table)}
    finally:
        reopened.close()


def test_an_existing_database_loses_the_indexes_that_went_when_opened(
    store, home_env, database_url
):
    """Indexes that cost every write of their table and served no lookup another index
    does not: a database made with them is rid of them when it is opened for writing,
    and one made now never has them."""
    from pi_workflows.storage import open_state
    from pi_workflows.storage.database import index_names
    from pi_workflows.storage.models import DROPPED_INDEXES

    made_before = {
        "runs_status_updated_at": "runs (status, updated_at)",
        "runs_created_at": "runs (created_at)",
        "events_run_id": "events (run_id)",
        "node_attempts_run_id": "node_attempts (run_id)",
        "workflow_messages_run_id": "workflow_messages (run_id)",
        "worker_messages_worker_epoch": "worker_messages (worker_epoch)",
    }
    assert set(made_before) == set(DROPPED_INDEXES)
    assert not set(DROPPED_INDEXES) & index_names(store.db)
    for name, columns in made_before.items():
        store.db.execute_sql(f"CREATE INDEX {name} ON {columns}")
    store.close()
    reopened = open_state(home_env.home, database_url)
    try:
        assert not set(DROPPED_INDEXES) & index_names(reopened.db)
    finally:
        reopened.close()


def test_the_index_names_read_at_once_include_those_peewee_finds_table_by_table(store):
    """Opening a store reads every index name in one query; peewee's per-table way (kept
    for other kinds of database) finds no index that one misses, and neither sees a
    dropped one."""
    from pi_workflows.storage.database import index_names, index_names_by_table
    from pi_workflows.storage.models import ADDED_INDEXES

    by_table = index_names_by_table(store.db)
    assert {index._name for _, index in ADDED_INDEXES} <= by_table <= index_names(store.db)
    dropped = ADDED_INDEXES[0][1]._name
    store.db.execute_sql(f"DROP INDEX {dropped}")
    assert dropped not in index_names(store.db) | index_names_by_table(store.db)


def test_state_status_shows_the_room_a_prune_frees(store, make_run, backend):
    from pi_workflows.storage.maintenance import state_status

    space = state_status(store)["space"]

    assert space["bytes"] > 0
    if backend == "sqlite":
        assert 0 <= space["freeBytes"] <= space["bytes"]
    else:  # left to autovacuum: its backlog is shown
        assert space["deadRows"] >= 0 and space["liveRows"] >= 0


@pytest.mark.sqlite_only
def test_a_pruned_sqlite_file_is_vacuumed_only_when_large_and_free_enough(
    store, make_run, monkeypatch
):
    from pi_workflows.storage import maintenance

    with store.transaction():
        for index in range(20):
            _finished_run(make_run, f"big-{index}", input={"text": f"{index}" * 200_000})
    prune(store, CUTOFF, apply=True)
    freed = maintenance.state_status(store)["space"]

    assert freed["freeBytes"] > 0.2 * freed["bytes"]
    assert maintenance.vacuum_if_worthwhile(store) is False  # under 64 MiB: left as it is
    monkeypatch.setattr(maintenance, "VACUUM_MIN_BYTES", 1024 * 1024)
    assert maintenance.vacuum_if_worthwhile(store) is True
    after = maintenance.state_status(store)["space"]
    assert after["freeBytes"] == 0 and after["bytes"] < freed["bytes"]


def test_old_blobs_nothing_references_go_and_those_a_kept_value_nests_stay(store, make_run):
    big = {"text": "y" * (2 * PART_MIN_BYTES)}
    with store.transaction():
        earlier_snapshot = put_json({"step": 1})  # replaced by a later one while it ran
        recent_orphan = put_json({"step": "just written"})
        make_run("kept")
        kept_state = put_json_in_parts({"out": big})
        Run.update(state_hash=kept_state).where(Run.run_id == "kept").execute()
    old_ones = [earlier_snapshot, *[b.blob_hash for b in Blob.select()]]
    Blob.update(created_at=OLD).where(Blob.blob_hash.in_(old_ones)).execute()
    Blob.update(created_at=now_ms()).where(Blob.blob_hash == recent_orphan).execute()

    report = prune(store, CUTOFF, apply=True)

    assert report.blobs == 1
    assert Blob.get_or_none(Blob.blob_hash == earlier_snapshot) is None
    assert Blob.get_or_none(Blob.blob_hash == recent_orphan) is not None
    from pi_workflows.storage import read_json

    assert read_json(kept_state) == {"out": big}
    assert state_verify(store) == []


def test_a_definition_snapshot_stays_while_a_run_names_it(store, make_run):
    from pi_workflows.canonical import digest
    from pi_workflows.storage import read_json
    from pi_workflows.storage.run_graph import store_definition

    shared = {"name": "shared", "startAt": "a", "nodes": {}, "edges": []}
    alone = {"name": "alone", "startAt": "a", "nodes": {}, "edges": []}
    with store.transaction():
        for run_id, snapshot in (("gone", shared), ("kept", shared), ("only", alone)):
            store_definition(snapshot, digest(snapshot))
            make_run(run_id, definition_digest=digest(snapshot))
        _finish("gone", OLD)
        _finish("only", OLD)
    # Old enough that the pass over blobs nothing references would take them too.
    Blob.update(created_at=OLD).where(Blob.blob_hash.in_([digest(shared), digest(alone)])).execute()

    report = prune(store, CUTOFF, apply=True)

    assert report.runs == 2
    assert read_json(digest(shared)) == shared  # "kept" still names it
    assert Blob.get_or_none(Blob.blob_hash == digest(alone)) is None
    assert state_verify(store) == []


# --- a prune step reads through indexes ---------------------------------------------------------


def _full_scans(store, sql: str, params) -> list[str]:
    """The tables (or whole indexes) the database would read through to run `sql`."""
    if store.is_sqlite:
        plan = store.db.execute_sql("EXPLAIN QUERY PLAN " + sql, params).fetchall()
        return [row[3] for row in plan if row[3].startswith("SCAN ")]
    (plan,) = store.db.execute_sql("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()[0]
    scans, nodes = [], [plan["Plan"]]
    while nodes:
        node = nodes.pop()
        nodes += node.get("Plans", [])
        if node["Node Type"] == "Seq Scan":
            scans.append(f"Seq Scan on {node['Relation Name']}")
        elif "Index Name" in node and "Index Cond" not in node:
            scans.append(f"{node['Node Type']} of {node['Index Name']}")
    return scans


def test_a_prune_step_reads_no_table_whole(store, make_run, backend, monkeypatch):
    """Every statement of a prune step (the lineages, their blobs, old blobs nothing
    references) finds its rows through an index, so a step costs what it deletes, not
    what the database holds. The plan's one pass over the runs is not a step."""
    from pi_workflows.storage import retention

    big = {"text": "z" * (2 * PART_MIN_BYTES)}
    with store.transaction():
        _finished_run(make_run, "gone", input={"shared": True})
        record_run_change("gone", event_type="step", actor="test", payload={"out": big})
        record_transcript("gone", {"nodeId": "a", "attemptId": "a-1", "entries": [1, 2]})
        _finished_run(make_run, "kept", at=now_ms(), input={"shared": True})
        put_json({"replaced": "snapshot"})
    Blob.update(created_at=OLD).execute()

    recorded: list[tuple[str, object]] = []
    planning = threading.local()
    execute_sql = store.db.execute_sql

    def record(sql, params=None, *args, **kwargs):
        if not getattr(planning, "on", False) and sql.lstrip().startswith(("SELECT", "DELETE")):
            recorded.append((sql, params))
        return execute_sql(sql, params, *args, **kwargs)

    finished_roots = retention._finished_roots

    def plan_unrecorded(before, roots):
        planning.on = roots is None
        try:
            return finished_roots(before, roots)
        finally:
            planning.on = False

    monkeypatch.setattr(store.db, "execute_sql", record)
    monkeypatch.setattr(retention, "_finished_roots", plan_unrecorded)
    report = prune(store, CUTOFF, apply=True)
    monkeypatch.undo()

    assert report.runs == 1 and report.transcripts == 1 and report.blobs >= 4
    if backend == "postgresql":  # an index it could use instead shows, however small the table
        store.db.execute_sql("SET enable_seqscan = off")
    scans = {sql: _full_scans(store, sql, params) for sql, params in recorded}
    assert {sql: found for sql, found in scans.items() if found} == {}


# --- writers alongside a prune (PostgreSQL) ------------------------------------------------
# SQLite has one writer at a time (`BEGIN IMMEDIATE`), so a prune step and a write never
# overlap there; on PostgreSQL they do, each on its connection (peewee's per thread).


def _on_own_connection(store, work):
    """`work()` on this thread's own connection, closed afterwards."""

    def run():
        store.db.connect(reuse_if_open=True)
        try:
            return work()
        finally:
            store.db.close()

    return run


def _waiting_on_a_lock(store) -> bool:
    """Another connection of this database waits for a lock (as a blocked writer does)."""
    query = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return store.db.execute_sql(query).fetchone()[0] > 0


class _Pause:
    """Where the first of two transactions stops until the second has gone as far as it can."""

    def __init__(self) -> None:
        self.reached, self.released = threading.Event(), threading.Event()

    def hold(self) -> None:
        self.reached.set()
        assert self.released.wait(60)


def _interleaved(store, pause: _Pause, first, second):
    """Run `first` until it reaches `pause`, then `second` until it finishes or waits for a
    lock `first` holds, then let `first` go on. Returns both futures, done."""
    from concurrent.futures import ThreadPoolExecutor, wait

    with ThreadPoolExecutor(2) as pool:
        try:
            one = pool.submit(_on_own_connection(store, first))
            wait_until(lambda: pause.reached.is_set() or one.done(), what="the first to pause")
            assert pause.reached.is_set(), one.result()
            two = pool.submit(_on_own_connection(store, second))
            wait_until(lambda: two.done() or _waiting_on_a_lock(store), what="the second")
        finally:
            pause.released.set()
        wait([one, two], timeout=60)
    return one, two


def _hold_after(monkeypatch, name: str, pause: _Pause, when=lambda argument: True) -> None:
    """The prune's step `name` (a function of storage.retention) holds at `pause` after it
    ran, when `when(its argument)`."""
    from pi_workflows.storage import retention

    step = getattr(retention, name)

    def step_then_hold(argument):
        result = step(argument)
        if when(argument):
            pause.hold()
        return result

    monkeypatch.setattr(retention, name, step_then_hold)


def _prune_all(store):
    return lambda: prune(store, CUTOFF, apply=True)


SHARED = {"shared": "input both runs carry"}


def _old_run_holding_the_shared_blob(store, make_run) -> str:
    with store.transaction():
        _finished_run(make_run, "gone", input=SHARED)
    return Run.get_by_id("gone").input_hash


def _the_new_run_reads_back_its_input(store, shared_hash) -> None:
    from pi_workflows.storage import read_json

    assert not _exists("gone")
    assert Blob.get_or_none(Blob.blob_hash == shared_hash) is not None
    assert read_json(Run.get_by_id("new").input_hash) == SHARED
    assert state_verify(store) == []


def test_a_blob_a_writer_reuses_in_an_open_transaction_survives_a_prune(postgres_store, make_run):
    store, pause = postgres_store, _Pause()
    shared_hash = _old_run_holding_the_shared_blob(store, make_run)

    def write():
        with store.transaction():
            make_run("new", input=SHARED)  # stores the input: finds the blob stored already
            pause.hold()

    # The prune runs to its end or waits for the writer; either way, then it commits.
    writing, pruning = _interleaved(store, pause, write, _prune_all(store))

    writing.result()
    assert pruning.result().runs == 1
    _the_new_run_reads_back_its_input(store, shared_hash)


def test_a_blob_a_writer_reuses_after_the_prune_checked_it_survives(
    postgres_store, make_run, monkeypatch
):
    store, pause = postgres_store, _Pause()
    shared_hash = _old_run_holding_the_shared_blob(store, make_run)
    # Nothing references the blob yet: it is about to be deleted.
    _hold_after(monkeypatch, "_still_referenced", pause, lambda hashes: shared_hash in hashes)

    def write():
        with store.transaction():
            make_run("new", input=SHARED)

    # The writer commits its reference or waits for the prune's lock on the blob.
    pruning, writing = _interleaved(store, pause, _prune_all(store), write)

    assert pruning.result().runs == 1
    writing.result()
    _the_new_run_reads_back_its_input(store, shared_hash)


def _old_lineage(store, make_run) -> object:
    with store.transaction():
        _finished_run(make_run, "root")
    return Run.get_by_id("root")


def _restart_of(parent) -> None:
    from pi_workflows.storage.runs import create_derived_run

    create_derived_run(
        parent, run_id="restart-1", lineage_kind="restart", input={"again": True}, actor="test"
    )


def test_a_restart_written_while_a_prune_runs_keeps_its_lineage(postgres_store, make_run):
    store, pause = postgres_store, _Pause()
    parent = _old_lineage(store, make_run)

    def restart():
        with store.transaction():
            _restart_of(parent)
            pause.hold()

    restarting, pruning = _interleaved(store, pause, restart, _prune_all(store))

    restarting.result()
    assert pruning.result().runs == 0
    assert _exists("root") and _exists("restart-1")
    assert state_verify(store) == []


def test_a_restart_of_a_run_the_prune_is_deleting_fails_and_leaves_nothing_behind(
    postgres_store, make_run, monkeypatch
):
    from pi_workflows.errors import NotFoundError

    store, pause = postgres_store, _Pause()
    parent = _old_lineage(store, make_run)
    # The lineage is finished and nothing protects it: it is about to be deleted.
    _hold_after(monkeypatch, "_protected_runs", pause)

    def restart():
        with store.transaction():
            _restart_of(parent)

    # The restart commits or waits for the prune's lock on the run it restarts.
    pruning, restarting = _interleaved(store, pause, _prune_all(store), restart)

    assert pruning.result().runs == 1
    with pytest.raises(NotFoundError):
        restarting.result()
    assert not _exists("root") and not _exists("restart-1")
    assert state_verify(store) == []


def test_state_verify_reports_a_blob_a_kept_value_names_that_is_missing(store, make_run):
    with store.transaction():
        make_run("kept")
        state_hash = put_json_in_parts({"out": {"text": "v" * (2 * PART_MIN_BYTES)}})
        Run.update(state_hash=state_hash).where(Run.run_id == "kept").execute()
    (part,) = [
        row.blob_hash for row in NestedBlob.select().where(NestedBlob.holder_hash == state_hash)
    ]
    assert state_verify(store) == []

    Blob.delete().where(Blob.blob_hash == part).execute()  # what a wrong prune would do

    assert state_verify(store) == [
        f"blob {state_hash[:12]}: names blob {part[:12]}, which is missing"
    ]
