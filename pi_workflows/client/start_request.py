"""Building a `run.start` payload: the client resolves the workflow, the host never does.

Workflow modules run user code, so they are imported in a child of the client (under a
deadline and a memory limit, see `discovery.isolation`) and in workers, never in the
host; the host stores the source identity, the digest and the definition snapshot (the
graph viewers draw), and the worker verifies the source and digest before it runs anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..discovery import describe_one
from ..errors import WorkflowDefinitionError


def start_payload(
    workflow_name: str,
    project: Path,
    run_input: Any = None,
    *,
    session_id: str | None = None,
) -> dict[str, Any]:
    """The `run.start` payload for `workflow_name` as seen from `project`."""
    project = project.resolve()
    entry = describe_one(workflow_name, project)
    if entry.get("error") or entry.get("source") is None:
        raise WorkflowDefinitionError(
            entry.get("error") or f"Workflow {workflow_name!r} is broken."
        )
    payload: dict[str, Any] = {
        "workflowName": entry["name"],
        "workflowRef": entry["name"],
        "workflowSource": entry["source"],
        "definitionDigest": entry["definitionDigest"],
        "definitionSnapshot": entry["definition"],
        "projectPath": str(project),
        "input": {} if run_input is None else run_input,
        "executionMode": "interactive" if session_id else "headless",
    }
    if session_id:
        payload["originSessionId"] = session_id
    if isinstance(entry.get("presentationPrompt"), str):
        payload["presentationPrompt"] = entry["presentationPrompt"]
    return payload
