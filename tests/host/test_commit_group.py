"""Group commit of worker writes and starts (host/commit_group.py) on a real state store."""

from __future__ import annotations

import asyncio

import peewee

from pi_workflows.errors import BlobConflictError, ConflictError
from pi_workflows.host.commit_group import HOLD_S, MAX_HOLD_S, CommitGroup
from pi_workflows.storage import record_run_change, statements
from pi_workflows.storage.blobs import put_json, read_json
from pi_workflows.storage.models import Blob
from pi_workflows.storage.runs import current_revision


def _no_claim_pass(freed: list) -> None:
    raise AssertionError("no entry asked for a claim pass")


def test_writes_submitted_together_commit_once_and_a_refused_one_undoes_only_itself(
    store, make_run
):
    with store.transaction():
        for run_id in ("group-a", "group-b", "group-c"):
            make_run(run_id)
    applied: list[str] = []
    committed: list[int] = []  # how many writes had been applied when each commit landed

    def write(run_id: str, refuse: bool = False):
        def apply() -> int:
            applied.append(run_id)
            store.after_commit(lambda: committed.append(len(applied)))
            revision = record_run_change(
                run_id, event_type="run.started", actor="test", status="running"
            )
            if refuse:
                raise ConflictError(f"{run_id} refused")
            return revision

        return apply

    async def together() -> list:
        group = CommitGroup(store, _no_claim_pass)
        futures = [group.submit(write("group-a")), group.submit(write("group-b", refuse=True))]
        futures.append(group.submit(write("group-c")))
        return await asyncio.gather(*futures, return_exceptions=True)

    first, refused, last = asyncio.run(together())

    assert (first, last) == (2, 2)
    assert isinstance(refused, ConflictError)
    # Applied as one block until the refusal, rolled back, then each in a block of its
    # own; one commit after that, and the refused write's callback went with it.
    assert applied == ["group-a", "group-b", "group-a", "group-b", "group-c"]
    assert committed == [5, 5]
    revisions = [current_revision(run_id) for run_id in ("group-a", "group-b", "group-c")]
    assert revisions == [2, 1, 2]


def test_a_lone_write_commits_by_itself_on_the_next_loop_pass(store, make_run):
    with store.transaction():
        make_run("group-lone")

    async def alone() -> int:
        group = CommitGroup(store, _no_claim_pass)
        future = group.submit(
            lambda: record_run_change("group-lone", event_type="run.started", actor="test")
        )
        assert not future.done()  # nothing runs inside submit()
        return await future

    assert asyncio.run(alone()) == 2
    assert not store.in_transaction and current_revision("group-lone") == 2


def test_a_streaming_client_holds_worker_turns_but_never_longer_than_the_bound(store):
    async def stream() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        group = CommitGroup(store, _no_claim_pass)
        group.hold()  # a start of a streaming client was answered
        began = loop.time()
        turn = asyncio.ensure_future(group.worker_turn())
        await asyncio.sleep(0)
        waited_while_held = not turn.done()
        # The client keeps answering starts every millisecond for ten times the bound.
        while loop.time() - began < 10 * MAX_HOLD_S and not turn.done():
            await asyncio.sleep(0.001)
            group.hold()
        went_on_after = loop.time() - began
        group.release()
        await turn
        return waited_while_held, went_on_after

    waited_while_held, went_on_after = asyncio.run(stream())
    assert waited_while_held
    # The worker's turn came while the client was still streaming (after the bound, or
    # sooner when a slow machine paced the stream slower than HOLD_S).
    assert went_on_after < 10 * MAX_HOLD_S


def test_a_hold_ends_by_itself_when_the_client_sends_no_further_start(store):
    async def one_hold() -> float:
        loop = asyncio.get_running_loop()
        group = CommitGroup(store, _no_claim_pass)
        group.hold()
        began = loop.time()
        await group.worker_turn()
        return loop.time() - began

    assert HOLD_S * 0.9 <= asyncio.run(one_hold()) < MAX_HOLD_S * 10


def test_a_failed_start_among_worker_writes_fails_alone_and_one_claim_pass_ends_the_group(
    store, make_run
):
    with store.transaction():
        for run_id in ("mixed-a", "mixed-b", "mixed-c", "mixed-d"):
            make_run(run_id)
    passes: list[list] = []  # the claim passes, each with the slots it was told are free

    async def mixed() -> list:
        group = CommitGroup(store, lambda freed: passes.append(list(freed)))

        def write(run_id: str, frees: str | None = None, fails: Exception | None = None):
            def apply() -> int:
                revision = record_run_change(run_id, event_type="run.started", actor="test")
                group.claim_at_end(freed=frees)  # a run id stands in for its ActiveRun
                if fails is not None:
                    raise fails
                return revision

            return apply

        futures = [
            group.submit(write("mixed-a", frees="mixed-a")),  # a worker write freeing a slot
            # A start that fails with an error that is not ours: contained, so only it fails.
            group.submit(write("mixed-b", fails=RuntimeError("boom")), contained=True),
            group.submit(write("mixed-c", frees="mixed-c", fails=ConflictError("stale"))),
            group.submit(write("mixed-d"), contained=True),  # a start
        ]
        group.commit_now()  # what a start does: no wait for the next loop pass
        assert all(future.done() for future in futures)
        return await asyncio.gather(*futures, return_exceptions=True)

    first, failed, refused, last = asyncio.run(mixed())

    assert (first, last) == (2, 2)
    assert isinstance(failed, RuntimeError) and isinstance(refused, ConflictError)
    revisions = [current_revision(r) for r in ("mixed-a", "mixed-b", "mixed-c", "mixed-d")]
    assert revisions == [2, 1, 1, 2]
    # One pass for the group; the failed entries' requests for it went with them.
    assert passes == [["mixed-a"]]


def test_a_start_is_answered_only_by_its_group_s_commit(store, make_run):
    with store.transaction():
        make_run("whole-a")
    seen_in_transaction: list[bool] = []

    def start() -> int:
        revision = record_run_change("whole-a", event_type="x", actor="test")
        seen_in_transaction.append(store.in_transaction)
        return revision

    def disk_fails() -> None:
        raise OSError("disk")

    async def group_of_two() -> list:
        group = CommitGroup(store, _no_claim_pass)
        futures = [
            group.submit(start, contained=True),
            group.submit(disk_fails),  # a worker write: a failure not ours is the group's
        ]
        group.commit_now()
        return await asyncio.gather(*futures, return_exceptions=True)

    started, failed = asyncio.run(group_of_two())
    # The start was applied (in the group's block, then in its own), but its group never
    # committed: no answer but the failure.
    assert seen_in_transaction == [True, True]
    assert isinstance(started, OSError) and isinstance(failed, OSError)
    assert current_revision("whole-a") == 1


def test_a_write_whose_failure_shows_only_at_a_later_statement_fails_its_entry_alone(
    store, make_run
):
    # On PostgreSQL a worker's stored reply is held back and sent with a later statement
    # (storage/deferred_statements.py); its failure must still be its own entry's.
    with store.transaction():
        for run_id in ("held-a", "held-b"):
            make_run(run_id)

    def write(run_id: str, fails: bool = False):
        def apply() -> int:
            revision = record_run_change(run_id, event_type="run.started", actor="test")
            if fails:  # no such worker: refused by a foreign key
                statements.insert_worker_message("no-such-worker", "m", "f", "ok", 1, None, None, 1)
            return revision

        return apply

    async def together() -> list:
        group = CommitGroup(store, _no_claim_pass)
        futures = [group.submit(write("held-a", fails=True), contained=True)]
        futures.append(group.submit(write("held-b"), contained=True))
        return await asyncio.gather(*futures, return_exceptions=True)

    failed, committed = asyncio.run(together())

    assert isinstance(failed, peewee.IntegrityError)
    assert committed == 2
    assert [current_revision(run_id) for run_id in ("held-a", "held-b")] == [1, 2]


def test_a_corrupted_blob_one_entry_takes_up_fails_that_entry_alone(store, make_run):
    # Applied as one block, the group checks the blobs its entries took up at its commit,
    # where a conflict cannot say whose it is: applied again, entry by entry, it is the
    # entry's that took the blob up, and the other entries commit.
    with store.transaction():
        for run_id in ("blob-a", "blob-b", "blob-c"):
            make_run(run_id)
        corrupted = put_json({"answer": 42})
    Blob.update(content=b'{"answer":43}').where(Blob.blob_hash == corrupted).execute()
    applied: list[str] = []

    def write(run_id: str, value: dict):
        def apply() -> str:
            applied.append(run_id)
            record_run_change(run_id, event_type="run.started", actor="test")
            return put_json(value)

        return apply

    async def together() -> list:
        group = CommitGroup(store, _no_claim_pass)
        futures = [
            group.submit(write("blob-a", {"kept": "a"})),
            group.submit(write("blob-b", {"answer": 42})),
            group.submit(write("blob-c", {"kept": "c"})),
        ]
        return await asyncio.gather(*futures, return_exceptions=True)

    kept_a, conflict, kept_c = asyncio.run(together())

    assert isinstance(conflict, BlobConflictError) and corrupted[:12] in str(conflict)
    assert (read_json(kept_a), read_json(kept_c)) == ({"kept": "a"}, {"kept": "c"})
    assert [current_revision(r) for r in ("blob-a", "blob-b", "blob-c")] == [2, 1, 2]
    assert applied == ["blob-a", "blob-b", "blob-c"] * 2  # the conflict showed at the commit
