"""The plugins' state view: in a running host, the fair-share recipe of docs/plugins.md,
loaded as the docs print it, holds a workflow to one running run; on a thread of a
plugin's, the view keeps one connection for the thread's calls."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from pi_workflows.plugin import state_view
from pi_workflows.storage import open_state
from pi_workflows.storage import state_view as state_view_module
from pi_workflows.storage.database import StateStore
from pi_workflows.testing import WorkflowHome

from ..conftest import create_test_run
from .conftest import HostHarness, wait_until
from .workflows import BLOCKER

DOCS = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"

# When a hello run completes, what does the view say of the others?
VIEW_SPY = """
import json
import os
import threading

from pi_workflows.plugin import hookimpl, state_view


def _look(run_id, found):
    view = state_view()
    found.update(
        running=[run.run_id for run in view.running_runs()],
        running_blockers=len(view.running_runs(workflow_name="blocker")),
        running_hello=len(view.running_runs(workflow_name="hello")),
        on_no_host=len(view.running_runs(host_id="no-such-host")),
        queued_blockers=view.queue_depth(workflow_name="blocker"),
        queued=view.queue_depth(),
        this_run=view.run(run_id).status,
        missing=view.run("no-such-run"),
    )


@hookimpl
def piw_run_transition(run_id, new_status, workflow_name):
    if workflow_name != "hello" or new_status != "completed":
        return
    found = {}
    looker = threading.Thread(target=_look, args=(run_id, found))  # a plugin's own thread
    looker.start()
    looker.join()
    path = os.environ["PIW_TEST_RECORD"]
    with open(path + ".part", "w") as handle:
        json.dump(found, handle)
    os.replace(path + ".part", path)  # whole, for the test that waits for it
"""


def recipe(name: str) -> str:
    text = DOCS.read_text()
    found = re.search(rf"<!-- recipe: {name} -->\n```python\n(.*?)```", text, re.S)
    assert found, f"docs/plugins.md has no recipe {name!r}"
    return found.group(1)


def test_the_fair_share_recipe_runs_one_run_of_a_workflow_at_a_time(harness: HostHarness):
    record = harness.root / "view.json"
    harness.add_plugin("fair_share", recipe("fair-share"))
    harness.add_plugin("view_spy", VIEW_SPY)
    harness.write_workflow("blocker", BLOCKER)
    harness.start_host(
        PI_WORKFLOWS_MAX_WORKERS="4", FAIR_SHARE_MAX_RUNNING="1", PIW_TEST_RECORD=str(record)
    )
    first = harness.start_run("blocker")
    harness.wait_for_pid("blocker.pid")
    second = harness.start_run("blocker")
    # Another workflow is claimed past the held run, and with free workers left over.
    other = harness.start_run("hello", {"name": "Ann"})
    harness.wait_for_status(other, "completed")
    client = harness.client()
    assert client.run_status(second)["queueStatus"] == "queued"
    assert client.run_status(first)["status"] == "running"
    wait_until(record.exists, what="the spy's look at the state")  # notified off the host's loop
    assert json.loads(record.read_text()) == {
        "running": [first],
        "running_blockers": 1,
        "running_hello": 0,
        "on_no_host": 0,
        "queued_blockers": 1,
        "queued": 1,
        "this_run": "completed",
        "missing": None,
    }

    (harness.project / "release").touch()
    harness.wait_for_status(first, "completed")
    harness.wait_for_status(second, "completed")
    started = dict(harness.query("SELECT run_id, started_at FROM run_queue"))
    finished = dict(harness.query("SELECT run_id, finished_at FROM run_queue"))
    assert finished[first] <= started[second]  # never both running


# --- one connection per thread -------------------------------------------------------------


def _count_connects(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one each time any thread opens a connection to `store`."""
    opened: list[int] = []
    connect = store.db._connect  # type: ignore[attr-defined]  # peewee's, not in its stubs

    def counting(*args: Any, **kwargs: Any) -> Any:
        opened.append(1)
        return connect(*args, **kwargs)

    monkeypatch.setattr(store.db, "_connect", counting)
    return opened


@pytest.fixture
def plugin_thread() -> Iterator[ThreadPoolExecutor]:
    """One thread that is not the store's, like a plugin's notification thread."""
    with ThreadPoolExecutor(max_workers=1) as thread:
        yield thread


def test_a_thread_that_reads_the_view_again_and_again_opens_one_connection(
    store: StateStore, monkeypatch: pytest.MonkeyPatch, plugin_thread: ThreadPoolExecutor
):
    with store.transaction():
        create_test_run("run-a", "blocker")
        create_test_run("run-b", "hello")
    opened = _count_connects(store, monkeypatch)

    def look() -> tuple[int, int, str | None]:
        view = state_view()
        found = view.run("run-a")
        return view.queue_depth(), view.queue_depth(workflow_name="blocker"), found and found.status

    answers = [plugin_thread.submit(look).result() for _ in range(50)]
    assert answers == [(2, 1, "queued")] * 50
    assert len(opened) == 1  # 150 queries, one connection (it was one a call)

    # The kept connection reads what commits after it opened.
    with store.transaction():
        create_test_run("run-c", "blocker")
    assert plugin_thread.submit(look).result() == (3, 2, "queued")
    # Another thread has a connection of its own.
    with ThreadPoolExecutor(max_workers=1) as other:
        assert other.submit(look).result() == (3, 2, "queued")
    assert len(opened) == 2


def test_past_the_kept_connections_a_thread_opens_one_for_each_call(
    store: StateStore, monkeypatch: pytest.MonkeyPatch, plugin_thread: ThreadPoolExecutor
):
    monkeypatch.setattr(state_view_module, "MAX_KEPT_CONNECTIONS", 1)
    with store.transaction():
        create_test_run("run-a")
    opened = _count_connects(store, monkeypatch)

    def look() -> int:
        return state_view().queue_depth()

    assert [plugin_thread.submit(look).result() for _ in range(3)] == [1, 1, 1]
    assert len(opened) == 1  # the first thread's connection is kept
    with ThreadPoolExecutor(max_workers=1) as other:
        assert [other.submit(look).result() for _ in range(3)] == [1, 1, 1]
        assert len(opened) == 4  # past the bound: one for each call, closed after it
        assert store.connection_use.counts() == {"host": 1, "stateView": 1}


def test_a_kept_connection_the_server_dropped_is_replaced_at_the_next_call(
    home_env: WorkflowHome, postgres_url: str, plugin_thread: ThreadPoolExecutor
):
    store = open_state(home_env.home, postgres_url)
    try:
        with store.transaction():
            create_test_run("run-a")

        def backend_pid() -> int:
            assert state_view().queue_depth() == 1
            return int(store.db.execute_sql("SELECT pg_backend_pid()").fetchone()[0])

        kept = plugin_thread.submit(backend_pid).result()
        assert plugin_thread.submit(backend_pid).result() == kept  # the same session
        store.db.execute_sql("SELECT pg_terminate_backend(%s)", (kept,))
        # A server restart, as far as that connection knows: the view answers anyway.
        assert plugin_thread.submit(backend_pid).result() != kept
    finally:
        store.close()


# A plugin that reads the view on its notification thread, which keeps the connection.
VIEW_ON_NOTIFICATION_THREAD = """
import os

from pi_workflows.plugin import hookimpl, state_view


@hookimpl
def piw_run_transition(run_id, new_status, workflow_name):
    if new_status == "completed":
        state_view().queue_depth()
        open(os.environ["PIW_TEST_RECORD"], "w").close()
"""


@pytest.mark.integration
def test_host_status_shows_the_database_connections_the_host_holds(harness: HostHarness):
    record = harness.root / "looked"
    harness.add_plugin("view_reader", VIEW_ON_NOTIFICATION_THREAD)
    harness.start_host(PIW_TEST_RECORD=str(record))
    assert json.loads(harness.cli("host", "status", "--json").stdout)["databaseConnections"] == {
        "host": 1
    }

    harness.wait_for_status(harness.start_run("hello", {"name": "Ann"}), "completed")
    wait_until(record.exists, what="the plugin to read the state view")
    status = json.loads(harness.cli("host", "status", "--json").stdout)
    assert status["databaseConnections"] == {"host": 1, "stateView": 1}
    text = harness.cli("host", "status").stdout
    assert "database connections: 1 host, 1 stateView" in text
