"""Group commit of worker writes (host/commit_group.py) on a real state store."""

from __future__ import annotations

import asyncio

from pi_workflows.errors import ConflictError
from pi_workflows.host.commit_group import CommitGroup
from pi_workflows.storage import record_run_change
from pi_workflows.storage.runs import current_revision


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
        group = CommitGroup(store)
        futures = [group.submit(write("group-a")), group.submit(write("group-b", refuse=True))]
        futures.append(group.submit(write("group-c")))
        return await asyncio.gather(*futures, return_exceptions=True)

    first, refused, last = asyncio.run(together())

    assert (first, last) == (2, 2)
    assert isinstance(refused, ConflictError)
    # One commit after all three writes; the refused write's callback went with it.
    assert committed == [3, 3]
    revisions = [current_revision(run_id) for run_id in ("group-a", "group-b", "group-c")]
    assert revisions == [2, 1, 2]


def test_a_lone_write_commits_by_itself_on_the_next_loop_pass(store, make_run):
    with store.transaction():
        make_run("group-lone")

    async def alone() -> int:
        group = CommitGroup(store)
        future = group.submit(
            lambda: record_run_change("group-lone", event_type="run.started", actor="test")
        )
        assert not future.done()  # nothing runs inside submit()
        return await future

    assert asyncio.run(alone()) == 2
    assert not store.in_transaction and current_revision("group-lone") == 2
