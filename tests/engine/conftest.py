"""Engine fixtures: runs in a real SQLite state store, executed in process."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import action, compute, edge, workflow
from pi_workflows.authoring import Workflow
from pi_workflows.engine import Engine
from pi_workflows.engine.local_backend import LocalRunBackend
from pi_workflows.storage import StateStore
from pi_workflows.storage.runs import create_run, new_run_id
from pi_workflows.testing import wait_until

SOURCE = {"kind": "builtin", "id": "test", "revision": "1"}


def count(path: Path) -> int:
    """How many lines a side-effect counter file has."""
    return len(path.read_text().splitlines()) if path.exists() else 0


def bump(path: Path) -> None:
    with path.open("a") as handle:
        handle.write("x\n")


def three_steps(tmp_path: Path, effect: Any, **workflow_options: Any) -> tuple:
    """a → b → c, where b blocks on its first visit until the attempt is stopped."""
    a_file, b_file = tmp_path / "a.count", tmp_path / "b.count"

    def first(ctx):
        bump(a_file)
        return {"a": True}

    def second(ctx):
        bump(b_file)
        if count(b_file) == 1:
            ctx.signal.wait(30)
        return {"b": count(b_file)}

    definition = workflow(
        "steps",
        "a",
        {
            "a": compute(first),
            "b": action(second, effect=effect),
            "c": compute(lambda ctx: {**ctx.outputs["a"], **ctx.outputs["b"]}),
        },
        [edge("a", "b"), edge("b", "c")],
        **workflow_options,
    )
    return definition, a_file, b_file


def park_in_b(runs: Runs, definition: Workflow, b_file: Path) -> str:
    """Start a run of a `three_steps` definition and park it while b runs; its id."""
    run_id = runs.create(definition)
    background = runs.in_thread(runs.engine(definition, run_id), {"kind": "start", "input": None})
    wait_until(lambda: count(b_file) == 1, what="node b to start")
    background.engine.park()
    assert background.join()["status"] == "parked"
    return run_id


@dataclass
class Runs:
    store: StateStore
    project: Path

    def create(
        self,
        definition: Workflow,
        input: Any = None,
        *,
        mode: str = "headless",
        session: str | None = None,
        parent: str | None = None,
        lineage: str | None = None,
    ) -> str:
        run_id = new_run_id(definition.name)
        with self.store.transaction():
            create_run(
                run_id=run_id,
                workflow_name=definition.name,
                workflow_ref=definition.name,
                workflow_source=SOURCE,
                definition_digest=definition.definition_digest,
                project_path=str(self.project),
                input=input,
                actor="test",
                execution_mode=mode,
                origin_session_id=session,
                parent_run_id=parent,
                lineage_kind=lineage,
            )
        return run_id

    def engine(self, definition: Workflow, run_id: str) -> Engine:
        return Engine(definition, LocalRunBackend(self.store, run_id))

    def start(self, definition: Workflow, input: Any = None, **options: Any) -> dict[str, Any]:
        run_id = self.create(definition, input, **options)
        return self.engine(definition, run_id).execute({"kind": "start", "input": input})

    def state(self, run_id: str) -> dict[str, Any]:
        return LocalRunBackend(self.store, run_id).read_run_state()["state"]

    def in_thread(self, engine: Engine, command: dict[str, Any]) -> BackgroundRun:
        background = BackgroundRun(engine, command)
        background.thread.start()
        return background


class BackgroundRun:
    """An engine executing a command on another thread (to cancel or park it)."""

    def __init__(self, engine: Engine, command: dict[str, Any]) -> None:
        self.engine = engine
        self.outcome: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self._run, args=(command,), daemon=True)

    def _run(self, command: dict[str, Any]) -> None:
        self.outcome = self.engine.execute(command)

    def join(self, timeout: float = 20.0) -> dict[str, Any]:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "engine did not stop"
        assert self.outcome is not None
        return self.outcome


@pytest.fixture
def runs(store: StateStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runs:
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    return Runs(store, project)
