"""Many runs at once, for tests and benchmarks that need a database that is already full."""

from __future__ import annotations

from pathlib import Path

from ..home import Home


def seed_finished_runs(
    home: Home,
    project: Path,
    count: int,
    *,
    first_created_at: int,
    step_ms: int = 1,
    prefix: str = "run",
    per_transaction: int | None = None,
) -> list[str]:
    """`count` completed runs of the built-in `hello` (`run-000000`, … with `prefix`
    "run"), each created and finished `step_ms` after the one before, the first at
    `first_created_at` (epoch ms; in the past, a host's retention prunes them once they
    are older than it). Inserted through the storage API, all in one transaction, or
    `per_transaction` at a time: beside a running host (SQLite lets it write between
    them), which otherwise owns the store. Their ids."""
    from ..storage import open_state
    from ..storage.models import Run, RunQueue
    from ..storage.runs import create_run

    store = open_state(home)
    run_ids = [f"{prefix}-{index:06d}" for index in range(count)]
    step = per_transaction or max(count, 1)
    try:
        for start in range(0, count, step):
            with store.transaction():
                for index in range(start, min(count, start + step)):
                    run_id = run_ids[index]
                    create_run(
                        run_id=run_id,
                        workflow_name="hello",
                        workflow_ref="hello",
                        workflow_source={"kind": "builtin", "id": "hello", "revision": "1"},
                        definition_digest="0" * 64,
                        project_path=str(project),
                        input={"name": run_id},
                        actor="seed",
                    )
                    at = first_created_at + index * step_ms
                    Run.update(status="completed", created_at=at, finished_at=at).where(
                        Run.run_id == run_id
                    ).execute()
                    RunQueue.update(status="done").where(RunQueue.run == run_id).execute()
    finally:
        store.close()
    return run_ids
