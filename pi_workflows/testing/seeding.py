"""Many runs at once, for tests and benchmarks that need a database that is already full."""

from __future__ import annotations

from pathlib import Path

from ..home import Home


def seed_finished_runs(
    home: Home, project: Path, count: int, *, first_created_at: int, step_ms: int = 1
) -> list[str]:
    """`count` completed runs of the built-in `hello` (`run-000000`, …), created `step_ms`
    apart from `first_created_at`, oldest first; inserted through the storage API in one
    transaction, before a host starts (a running host owns the store). Runs finished
    before the retention period are pruned when a host starts. Their ids."""
    from ..storage import open_state
    from ..storage.models import Run, RunQueue
    from ..storage.runs import create_run

    store = open_state(home)
    run_ids = []
    try:
        with store.transaction():
            for index in range(count):
                run_id = f"run-{index:06d}"
                create_run(
                    run_id=run_id,
                    workflow_name="hello",
                    workflow_ref="hello",
                    workflow_source={"kind": "builtin", "id": "hello", "revision": "1"},
                    definition_digest="0" * 64,
                    project_path=str(project),
                    input={},
                    actor="seed",
                )
                at = first_created_at + index * step_ms
                Run.update(status="completed", created_at=at, finished_at=at).where(
                    Run.run_id == run_id
                ).execute()
                RunQueue.update(status="done").where(RunQueue.run == run_id).execute()
                run_ids.append(run_id)
    finally:
        store.close()
    return run_ids
