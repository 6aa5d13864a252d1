"""Built-in worker launch: the run command rules of SPEC §7.3 and the worker process."""

from __future__ import annotations

import json

from ..hookspecs import hookimpl
from ..records import (
    RunRecord,
    WorkerLaunchEnvelope,
    WorkerProcessSpec,
    WorkerRunCommand,
    WorkerSettings,
)
from ..worker.command import LAUNCH_ENV, worker_argv, worker_pythonpath

__all__ = ["LAUNCH_ENV", "piw_worker_process", "piw_worker_run_command"]


@hookimpl(trylast=True)
def piw_worker_run_command(
    record: RunRecord, resume_interaction_attempt_id: str | None
) -> WorkerRunCommand:
    if record.is_initialized:
        return WorkerRunCommand(
            "resume", resume_interaction_attempt_id=resume_interaction_attempt_id
        )
    if record.lineage_kind == "restart":
        return WorkerRunCommand("restart", input=record.input)
    if record.lineage_kind == "continuation":
        if record.parent_run_id is None:
            raise ValueError(f"Workflow continuation {record.run_id} has no parent run")
        return WorkerRunCommand(
            "continue",
            input=record.input,
            parent_run_id=record.parent_run_id,
            human_decision=record.launch_options.get("humanDecision"),
        )
    if record.parent_run_id is not None:
        raise ValueError(f"Workflow run {record.run_id} has a parent without a lineage kind")
    return WorkerRunCommand("start", input=record.input)


@hookimpl(trylast=True)
def piw_worker_process(
    envelope: WorkerLaunchEnvelope, settings: WorkerSettings
) -> WorkerProcessSpec:
    env = {LAUNCH_ENV: json.dumps(envelope), "PYTHONPATH": worker_pythonpath()}
    return WorkerProcessSpec(
        argv=worker_argv(settings.python),
        env=env,
        cwd=envelope.get("projectPath"),
        forkable=True,
    )
