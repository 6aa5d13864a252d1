"""PostgreSQL plans a key lookup once per connection: prepared between transactions once it
ran twice, executed from then on; a statement the server cannot prepare runs as it is."""

from __future__ import annotations

from pi_workflows.storage import StateStore, server_plans, statements
from pi_workflows.storage.models import Run

RUN_REVISION = "SELECT revision FROM runs WHERE run_id = ?"


def _prepared(store: StateStore) -> dict[str, int]:
    """The statements this connection holds prepared, by text: how often each ran on a
    generic plan (without planning)."""
    found = store.db.execute_sql(
        "SELECT statement, generic_plans FROM pg_prepared_statements"
    ).fetchall()
    return {statement.split(" AS ", 1)[1]: generic for statement, generic in found}


def _revision(store: StateStore, run_id: str) -> list[tuple[int]]:
    with store.transaction():
        return statements.rows(RUN_REVISION, (run_id,))


def test_a_key_lookup_run_twice_is_planned_once_and_then_only_executed(postgres_store, make_run):
    with postgres_store.transaction():
        make_run("r-1")
    planned_text = "SELECT revision FROM runs WHERE run_id = $1"

    assert _revision(postgres_store, "r-1") == [(1,)]
    assert planned_text not in _prepared(postgres_store)  # once is not worth a round trip
    assert _revision(postgres_store, "r-1") == [(1,)]
    assert _prepared(postgres_store).get(planned_text) == 0  # prepared after that transaction

    assert [_revision(postgres_store, run_id) for run_id in ("r-1", "r-2", "r-1")] == [
        [(1,)],
        [],
        [(1,)],
    ]
    assert _prepared(postgres_store)[planned_text] == 3  # executed, never planned again


def test_a_statement_the_server_cannot_prepare_runs_as_it_is(postgres_store, make_run):
    # The server cannot tell the type of this parameter: PREPARE refuses it.
    unknown_type = "SELECT %s IS NULL"
    for number in range(3):
        with postgres_store.transaction():
            assert server_plans.run(postgres_store.db, unknown_type, ["x"]).fetchall() == [(False,)]
            make_run(f"r-{number}")  # the transaction goes on and commits

    assert not any(text.startswith("SELECT $1") for text in _prepared(postgres_store))
    with postgres_store.transaction():
        assert statements.rows("SELECT count(*) FROM runs") == [(3,)]


def test_a_new_connection_runs_statements_as_they_are_until_it_plans_them(postgres_store, make_run):
    with postgres_store.transaction():
        make_run("r-1")
    for _ in range(2):
        _revision(postgres_store, "r-1")
    assert _prepared(postgres_store)

    postgres_store.db.close()  # as the connection guard does with a lost connection
    postgres_store.db.connect()

    assert _prepared(postgres_store) == {}
    assert _revision(postgres_store, "r-1") == [(1,)]  # not an EXECUTE of what the old one held
    assert _revision(postgres_store, "r-1") == [(1,)]
    assert "SELECT revision FROM runs WHERE run_id = $1" in _prepared(postgres_store)


def test_a_held_write_travels_as_an_execute_once_planned(postgres_store, make_run):
    with postgres_store.transaction():
        make_run("r-1")
    announce = (
        "UPDATE runs SET announced_status = CASE run_id WHEN $1 THEN $2 END WHERE run_id IN ($3)"
    )
    for status in ("first", "second", "third"):
        with postgres_store.transaction():  # held, it goes with the COMMIT
            statements.set_announced_statuses({"r-1": status})

    # The run's creation announced it too: prepared after "first", then executed twice.
    assert _prepared(postgres_store)[announce] == 2
    assert Run.get_by_id("r-1").announced_status == "third"


def test_a_lookup_alone_is_planned_too_and_runs_as_it_is_on_a_new_connection(
    postgres_store, make_run, postgres_server
):
    with postgres_store.transaction():
        make_run("r-1")
    planned_text = "SELECT revision FROM runs WHERE run_id = $1"
    for _ in range(2):
        assert statements.rows(RUN_REVISION, ("r-1",)) == [(1,)]  # no transaction
    with postgres_store.transaction():  # prepared when the next transaction ends
        make_run("r-2")
    assert statements.rows(RUN_REVISION, ("r-1",)) == [(1,)]
    assert _prepared(postgres_store)[planned_text] == 1

    # The server drops the connection; the guard sends the lookup again on a new one,
    # which holds no prepared statement: it runs as it is there.
    ((backend,),) = postgres_store.db.execute_sql("SELECT pg_backend_pid()").fetchall()
    postgres_server.execute(f"SELECT pg_terminate_backend({backend})")
    assert statements.rows(RUN_REVISION, ("r-2",)) == [(1,)]
    assert _prepared(postgres_store) == {}


def test_a_prepare_that_fails_never_fails_the_transaction_that_ran_before_it(
    postgres_store, make_run, monkeypatch
):
    with postgres_store.transaction():
        make_run("r-1")
    send = postgres_store.db.execute_sql

    def unlucky(sql, *args, **kwargs):
        if sql.startswith("PREPARE "):
            raise RuntimeError("the driver broke mid-call")
        return send(sql, *args, **kwargs)

    monkeypatch.setattr(postgres_store.db, "execute_sql", unlucky)
    for _ in range(3):  # the second ends by preparing: it commits all the same
        assert _revision(postgres_store, "r-1") == [(1,)]
    monkeypatch.undo()

    assert "SELECT revision FROM runs WHERE run_id = $1" not in _prepared(postgres_store)
