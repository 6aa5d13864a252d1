"""Retention on a running host: `state.prune` and the automatic sweep (1.15, 1.16, 4.11)."""

from __future__ import annotations

import datetime
import json

import pytest

from pi_workflows.client import HostConnection
from pi_workflows.clock import now_ms
from pi_workflows.storage import put_json, put_json_in_parts, read_json
from pi_workflows.storage.blobs import PART_MIN_BYTES
from pi_workflows.storage.models import Blob, Run, RunQueue
from pi_workflows.storage.retention import DAY_MS
from pi_workflows.storage.run_state import record_transcript
from tests.conftest import create_test_run

from .conftest import HostHarness, request_frame, send_together, wait_until

OLD = now_ms() - 40 * DAY_MS


def _old_finished_runs(harness: HostHarness, *run_ids: str) -> None:
    """Runs that finished 40 days ago, written beside the host (or before it starts)."""
    store = harness.open_store()
    try:
        with store.transaction():
            for run_id in run_ids:
                create_test_run(run_id)
                _finish(run_id, OLD)
    finally:
        store.close()


def _finish(run_id: str, at: int) -> None:
    Run.update(status="completed", finished_at=at, updated_at=at).where(
        Run.run_id == run_id
    ).execute()
    RunQueue.update(status="done").where(RunQueue.run == run_id).execute()


def _run_ids(harness: HostHarness) -> set[str]:
    return {row[0] for row in harness.query("SELECT run_id FROM runs")}


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat()


@pytest.mark.scenario("4.11")
def test_state_prune_reports_applies_once_and_a_repeat_adopts_its_receipt(
    harness: HostHarness, backend: str, tmp_path
):
    harness.start_host(PI_WORKFLOWS_RETENTION="0")  # no sweep: the commands do it all
    _old_finished_runs(harness, "old-1", "old-2")
    kept = harness.start_run("hello", {"name": "Ada"})
    harness.wait_for_run(kept)
    before = _iso(now_ms() - 30 * DAY_MS)
    backup = tmp_path / "before-prune.sqlite"
    apply = {"before": before, "apply": True}
    if backend == "sqlite":  # PostgreSQL is backed up with pg_dump
        apply["backupPath"] = str(backup)

    with HostConnection(harness.home.socket_path) as connection:
        dry = connection.request("state.prune", {"before": before, "apply": False})
        assert dry.outcome == "accepted", dry.error
        assert dry.receipt["applied"] is False and dry.receipt["runs"] == 2
        assert _run_ids(harness) == {"old-1", "old-2", kept}

        first = connection.request("state.prune", apply, idempotency_key="prune-apply")
        again = connection.request("state.prune", apply, idempotency_key="prune-apply")
        bad = connection.request("state.prune", {"before": "last week", "apply": True})

    assert first.outcome == "accepted" and first.receipt["applied"] is True
    assert (first.receipt["runs"], first.receipt["lineages"]) == (2, 2)
    assert again.outcome == "adopted" and again.receipt == first.receipt
    assert bad.outcome == "rejected" and "ISO 8601" in bad.error
    assert _run_ids(harness) == {kept}
    if backend == "sqlite":
        assert backup.exists() and first.receipt["backup"]["destination"] == str(backup)
    assert harness.cli("state", "verify").stdout.strip() == "state ok"


@pytest.mark.scenario("1.15")
def test_the_host_sweeps_expired_runs_when_it_is_idle_and_shows_the_last_sweep(
    harness: HostHarness,
):
    _old_finished_runs(harness, "expired")
    recent = "recent"
    _old_finished_runs(harness, recent)
    store = harness.open_store()
    try:
        Run.update(finished_at=now_ms()).where(Run.run_id == recent).execute()
    finally:
        store.close()

    harness.start_host()

    last = wait_until(lambda: harness.status().get("lastPrune"), what="a sweep")
    assert last["outcome"] == "completed" and last["runs"] == 1
    assert _run_ids(harness) == {recent}
    assert harness.host_log().count("automatic state prune completed") == 1
    shown = harness.cli("host", "status").stdout
    assert "last prune: completed" in shown


def _block_deletes(harness: HostHarness, backend: str) -> None:
    """A database that refuses to delete runs: the sweep fails for real."""
    store = harness.open_store()
    try:
        if backend == "sqlite":
            store.db.execute_sql(
                "CREATE TRIGGER keep_runs BEFORE DELETE ON runs "
                "BEGIN SELECT RAISE(ABORT, 'runs are kept by this test'); END"
            )
        else:
            store.db.execute_sql(
                "CREATE FUNCTION keep_runs() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'runs are kept by this test'; END $$"
            )
            store.db.execute_sql(
                "CREATE TRIGGER keep_runs BEFORE DELETE ON runs "
                "FOR EACH ROW EXECUTE FUNCTION keep_runs()"
            )
    finally:
        store.close()


@pytest.mark.scenario("1.16")
def test_a_failed_sweep_is_logged_once_and_the_host_keeps_running(
    harness: HostHarness, backend: str
):
    _old_finished_runs(harness, "expired")
    _block_deletes(harness, backend)

    harness.start_host()

    last = wait_until(lambda: harness.status().get("lastPrune"), what="a sweep")
    assert last["outcome"] == "failed" and "kept by this test" in last["error"]
    # The host still serves and runs work; many idle poll ticks later it has not retried.
    run_id = harness.start_run("hello", {"name": "Ada"})
    assert harness.wait_for_run(run_id)["status"] == "completed"
    assert harness.host_log().count("automatic state prune failed") == 1
    assert "expired" in _run_ids(harness)


def test_the_cli_prunes_through_the_running_host_which_reports_its_progress(
    harness: HostHarness,
):
    harness.start_host(PI_WORKFLOWS_RETENTION="0")  # no sweep: the command does it all
    _old_finished_runs(harness, *(f"old-{n}" for n in range(60)))  # two steps of 50 lineages

    dry = harness.cli("state", "prune", "--older-than", "30d")
    assert dry.stdout.startswith("would prune 60 runs in 60 lineages")
    assert "so far: would prune 50 runs in 50 lineages" in dry.stderr  # after the first step
    assert len(_run_ids(harness)) == 60
    applied = json.loads(
        harness.cli("state", "prune", "--before", _iso(now_ms()), "--apply", "--json").stdout
    )

    assert (applied["applied"], applied["runs"], applied["lineages"]) == (True, 60, 60)
    assert _run_ids(harness) == set()
    # The host did it: it stored each command's receipt (one the CLI would not write).
    receipts = harness.query(
        "SELECT outcome FROM host_commands WHERE operation = ? ORDER BY created_at", "state.prune"
    )
    assert receipts == [("accepted",), ("accepted",)]
    bad = harness.cli("state", "prune", "--older-than", "soon", check=False)
    assert bad.returncode != 0
    assert "--older-than must be a duration such as 30d" in bad.stderr


def test_the_cli_prunes_nothing_without_a_host_when_told_not_to_start_one(harness: HostHarness):
    _old_finished_runs(harness, "old-1")

    result = harness.cli("--no-autostart", "state", "prune", "--apply", check=False)

    assert result.returncode != 0
    assert "No workflow host is running" in result.stderr
    assert _run_ids(harness) == {"old-1"}


def test_a_retry_of_a_prune_still_running_waits_for_it_and_adopts_its_receipt(
    harness: HostHarness, monkeypatch
):
    from pi_workflows.host.retention import Retention

    pruned = []
    prune = Retention._prune

    async def counted(self, *args, **kwargs):
        pruned.append(args)
        return await prune(self, *args, **kwargs)

    monkeypatch.setattr(Retention, "_prune", counted)  # the in-process host's feature
    harness.start_host(PI_WORKFLOWS_RETENTION="0")
    _old_finished_runs(harness, *(f"old-{n}" for n in range(120)))  # three steps
    frame = request_frame("prune-1", "state.prune", {"before": _iso(now_ms()), "apply": True})

    # The client's retry after a lost connection: the same request, while the first runs.
    (first, retry), events = send_together(harness, [frame, frame])

    assert (first["outcome"], retry["outcome"]) == ("accepted", "adopted")
    assert retry["receipt"] == first["receipt"] and first["receipt"]["runs"] == 120
    assert len(pruned) == 1
    assert {event["event"] for event in events} == {"prune_progress"}
    assert {event["subscriptionId"] for event in events} == {"prune-1"}
    assert _run_ids(harness) == set()


# --- blobs nested in other values --------------------------------------------------------

LARGE = {"report": "r" * (2 * PART_MIN_BYTES)}  # a member split off into a part of its own


def _run_with_nested_blobs(
    harness: HostHarness, run_id: str, finished_at: int, entries: list, state: dict | None = None
) -> None:
    """A finished run with an agent transcript (its event's payload names it) and, with
    `state`, a snapshot whose large members are parts; written beside the host."""
    store = harness.open_store()
    try:
        with store.transaction():
            create_test_run(run_id)
            attempt = {"nodeId": "agent", "attemptId": f"{run_id}-agent-1", "entries": entries}
            record_transcript(run_id, attempt)
            if state is not None:
                state_hash = put_json_in_parts(state)
                Run.update(state_hash=state_hash).where(Run.run_id == run_id).execute()
            _finish(run_id, finished_at)
    finally:
        store.close()


def _age_every_blob(harness: HostHarness, created_at: int) -> None:
    """Every blob older than any cut-off the test uses: the pass over old blobs that no row
    names looks at each of them, nested ones included."""
    store = harness.open_store()
    try:
        with store.transaction():
            Blob.update(created_at=created_at).execute()
    finally:
        store.close()


def _prune(harness: HostHarness, *cut_off: str) -> dict:
    return json.loads(harness.cli("state", "prune", *cut_off, "--apply", "--json").stdout)


def _stored(harness: HostHarness, blob_hash: str) -> bool:
    return bool(harness.query("SELECT 1 FROM blobs WHERE blob_hash = ?", blob_hash))


def test_blobs_a_kept_run_shares_with_a_pruned_one_survive_and_read_back(harness: HostHarness):
    """The pruned run's snapshot and transcript payload go; the part and the transcript they
    nest stay, because the kept run's values nest them too."""
    harness.start_host(PI_WORKFLOWS_RETENTION="0")  # no sweep: the command does it all
    words = [{"kind": "text", "text": "the same words in both runs"}]
    _run_with_nested_blobs(harness, "gone", OLD, words, {"out": LARGE, "n": 1})
    _run_with_nested_blobs(harness, "kept", now_ms(), words, {"out": LARGE, "n": 2})
    _age_every_blob(harness, OLD - DAY_MS)
    (state_hash,) = harness.query("SELECT state_hash FROM runs WHERE run_id = ?", "kept")[0]

    report = _prune(harness, "--older-than", "30d")

    assert (report["runs"], report["transcripts"]) == (1, 1)
    assert report["blobs"] >= 3  # its input, snapshot and transcript payload at least
    assert _run_ids(harness) == {"kept"}
    (transcript,) = json.loads(harness.cli("run", "transcript", "kept", "--json").stdout)
    assert transcript["entries"] == words
    store = harness.open_store()
    try:
        assert read_json(state_hash) == {"out": LARGE, "n": 2}
    finally:
        store.close()
    assert harness.cli("state", "verify").stdout.strip() == "state ok"


def test_a_transcript_goes_with_its_run_and_not_before(harness: HostHarness):
    """Only the transcript's event payload names it, and no row does directly: while its
    run is kept the pass over old blobs leaves it, and it goes with the run."""
    harness.start_host(PI_WORKFLOWS_RETENTION="0")
    _run_with_nested_blobs(harness, "old", OLD, [{"kind": "text", "text": "said only here"}])
    store = harness.open_store()
    try:
        with store.transaction():
            orphan = put_json({"a snapshot": "replaced while its run ran"})  # named by no row
    finally:
        store.close()
    _age_every_blob(harness, OLD - 2 * DAY_MS)
    named = harness.query("SELECT blob_hash FROM nested_blobs")
    assert len(named) == 1
    (transcript_hash,) = named[0]

    # A cut-off before the run finished: the run stays; the old blobs nothing names go.
    kept = _prune(harness, "--before", _iso(OLD - DAY_MS))

    assert kept["runs"] == 0 and kept["blobs"] >= 1
    assert not _stored(harness, orphan) and _stored(harness, transcript_hash)
    (shown,) = json.loads(harness.cli("run", "transcript", "old", "--json").stdout)
    assert shown["entries"] == [{"kind": "text", "text": "said only here"}]

    pruned = _prune(harness, "--older-than", "30d")

    assert (pruned["runs"], pruned["transcripts"]) == (1, 1)
    assert not _stored(harness, transcript_hash)
    assert harness.query("SELECT COUNT(*) FROM nested_blobs") == [(0,)]
    assert harness.cli("state", "verify").stdout.strip() == "state ok"
