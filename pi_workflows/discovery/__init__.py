"""Workflow discovery (SPEC §12): files first, then plugin-registered workflows.

Search order: every directory from `piw_workflow_dirs` (built-in: `<project>/.pi/workflows`
then `<config>/workflows`), sorted `*.workflow.py` files in each, then the workflows of
`piw_register_workflows`. The first name wins; a file's command name is its stem.

Loading a workflow runs its code, so the host never calls :func:`discover`; it asks a
resolver subprocess (:func:`resolve_in_subprocess`, :func:`list_in_subprocess`, which run
``python -m pi_workflows.discovery``). Workers load by saved source identity with
:func:`load_from_source`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import plugins
from ..authoring import Workflow
from ..canonical import sha256_hex
from ..errors import WorkflowDefinitionError, WorkflowSourceChangedError
from . import verdicts
from .isolation import describe_isolated
from .loader import (
    WORKFLOW_SUFFIX,
    check_definition_object,
    command_name,
    definition_from_bytes,
    load_workflow_file,
)

RESOLVER_TIMEOUT_SECONDS = 120.0
# The resolver process dies with the process that asked it (PR_SET_PDEATHSIG).
PARENT_PID_ENV = "PI_WORKFLOWS_RESOLVER_PARENT"


@dataclass(frozen=True)
class DiscoveredWorkflow:
    """One workflow name and what it resolved to: a definition, or why it is broken."""

    name: str
    source: dict[str, Any] | None
    definition: Workflow | None = None
    error: str | None = None

    def describe(self) -> dict[str, Any]:
        """The resolver's JSON answer for this workflow."""
        described: dict[str, Any] = {"name": self.name, "source": self.source}
        if self.definition is None:
            described["error"] = self.error
            return described
        described["definitionDigest"] = self.definition.definition_digest
        # The graph a run of it is started with: the host keeps it for viewers.
        described["definition"] = self.definition.snapshot()
        if isinstance(self.definition.presentation_prompt, str):
            described["presentationPrompt"] = self.definition.presentation_prompt
        return described


def registered_workflows() -> list[DiscoveredWorkflow]:
    """Workflows registered by plugins (built-ins included), loading them on the way.

    Their source kind is ``builtin`` for pi-workflows' own and ``plugin`` (with the
    plugin's name) for a third party's; a plugin whose registration raises is listed as
    broken and hides nobody else's workflows.
    """
    found: list[DiscoveredWorkflow] = []

    def register_for(plugin_name: str) -> Any:
        def register(name: str, workflow: Any, revision: str) -> None:
            source = {"kind": "builtin", "id": name, "revision": revision}
            if not plugins.is_builtin(plugin_name):
                source.update(kind="plugin", plugin=plugin_name)
            try:
                definition = check_definition_object(workflow, f"registered workflow {name!r}")
            except WorkflowDefinitionError as error:
                found.append(DiscoveredWorkflow(name, source, error=str(error)))
                return
            found.append(DiscoveredWorkflow(name, source, definition))

        return register

    for failure in plugins.register_workflows(register_for):
        found.append(
            DiscoveredWorkflow(f"({failure.plugin_name} workflows)", None, error=str(failure))
        )
    return found


def workflow_files(project: Path) -> dict[str, Path]:
    """Workflow files visible from `project` by command name, the first directory winning."""
    files: dict[str, Path] = {}
    for directory in plugins.workflow_dirs(project):
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if path.name.endswith(WORKFLOW_SUFFIX) and path.is_file():
                files.setdefault(command_name(path), path)
    return files


def load_file(name: str, path: Path) -> DiscoveredWorkflow:
    """Load one workflow file in this process (it runs the file's code)."""
    source = None
    try:
        content = path.read_bytes()
        source = {"kind": "file", "path": str(path.resolve()), "hash": sha256_hex(content)}
        definition = definition_from_bytes(path.resolve(), content)
    except OSError as error:
        return DiscoveredWorkflow(name, None, error=str(error))
    except WorkflowDefinitionError as error:
        return DiscoveredWorkflow(name, source, error=str(error))
    return DiscoveredWorkflow(name, source, definition)


def discover(project: Path) -> list[DiscoveredWorkflow]:
    """Every workflow visible from `project`, first name wins, broken ones included.

    Loads every file in this process; clients use :func:`describe_all` instead.
    """
    winners = {
        name: load_file(name, path) for name, path in workflow_files(project.resolve()).items()
    }
    for entry in registered_workflows():
        winners.setdefault(entry.name, entry)
    return list(winners.values())


def find(name: str, project: Path) -> DiscoveredWorkflow:
    for entry in discover(project):
        if entry.name == name:
            return entry
    return _not_found(name)


def _not_found(name: str) -> DiscoveredWorkflow:
    return DiscoveredWorkflow(
        name, None, error=f"No workflow named {name!r}; see 'pi-workflows workflows'."
    )


def _describe_file(name: str, path: Path) -> dict[str, Any]:
    return load_file(name, path).describe()


def _described(name: str, path: Path) -> dict[str, Any]:
    """The file's description from its own child process, or the broken verdict it
    got last time, if nothing it was given for changed since (`verdicts`)."""
    answer = verdicts.remembered(path)
    if answer is None:
        answer = describe_isolated(name, path, _describe_file)
        verdicts.record(path, answer)
    return answer


def describe_one(name: str, project: Path) -> dict[str, Any]:
    """The description of workflow `name`, loading only its own file, in a child process."""
    path = workflow_files(project.resolve()).get(name)
    if path is not None:
        return _described(name, path)
    entry = next((e for e in registered_workflows() if e.name == name), None)
    return (entry or _not_found(name)).describe()


def describe_all(project: Path) -> list[dict[str, Any]]:
    """Every workflow visible from `project`, each file loaded in its own child process."""
    described = {
        name: _described(name, path) for name, path in workflow_files(project.resolve()).items()
    }
    for entry in registered_workflows():
        described.setdefault(entry.name, entry.describe())
    return list(described.values())


def load_from_source(source: dict[str, Any], definition_digest: str | None = None) -> Workflow:
    """Load a workflow by its saved source identity, refusing any change (worker side).

    Raises :class:`WorkflowSourceChangedError` when the file's bytes, the built-in
    revision or the definition digest differ from what the run saved.
    """
    kind = source.get("kind")
    if kind == "file":
        path = Path(source["path"])
        try:
            content = path.read_bytes()
        except OSError as error:
            raise WorkflowSourceChangedError(
                f"Workflow file {path} cannot be read any more ({error.strerror}); restore it "
                "and resume the run, or cancel it."
            ) from None
        if sha256_hex(content) != source.get("hash"):
            raise WorkflowSourceChangedError(
                f"Workflow file {path} changed since the run was created; restore it and "
                "resume the run, or cancel it."
            )
        definition = definition_from_bytes(path, content)
    elif kind in ("builtin", "plugin"):
        entry = next((e for e in registered_workflows() if e.name == source.get("id")), None)
        if entry is None or entry.source is None:
            raise WorkflowSourceChangedError(
                f"Registered workflow {source.get('id')!r} is no longer installed; reinstall "
                "it and resume the run, or cancel it."
            )
        if entry.source["revision"] != source.get("revision"):
            raise WorkflowSourceChangedError(
                f"Registered workflow {source.get('id')!r} is at another revision than the "
                "run was created with; restore it and resume the run, or cancel it."
            )
        if entry.definition is None:
            raise WorkflowDefinitionError(entry.error or "broken workflow")
        definition = entry.definition
    else:
        raise WorkflowSourceChangedError(f"Unknown workflow source kind {kind!r}.")
    if definition_digest is not None and definition.definition_digest != definition_digest:
        raise WorkflowSourceChangedError(
            f"Workflow {definition.name!r} now has another definition digest than the run "
            "was created with; restore it and resume the run, or cancel it."
        )
    return definition


def _resolver(arguments: list[str], project: Path) -> Any:
    package_root = str(Path(__file__).resolve().parent.parent.parent)
    env = dict(os.environ, **{PARENT_PID_ENV: str(os.getpid())})
    # The resolver must import this same pi_workflows, even from a source tree.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "pi_workflows.discovery", *arguments, "--project", str(project)],
            cwd=str(project),
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=RESOLVER_TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        raise WorkflowDefinitionError(
            f"Discovering the workflows of {project} took over {RESOLVER_TIMEOUT_SECONDS:g} s; "
            "see which files are slow with 'pi-workflows workflows'."
        ) from None
    try:
        return json.loads(completed.stdout)
    except ValueError:
        detail = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise WorkflowDefinitionError(
            f"The workflow resolver failed (exit {completed.returncode}): {detail}"
        ) from None


def resolve_in_subprocess(name: str, project: Path | str) -> dict[str, Any]:
    """`{name, source, definitionDigest, presentationPrompt?}` or `{name, source, error}`."""
    try:
        return _resolver(["resolve", name], Path(project).resolve())
    except WorkflowDefinitionError as error:
        return {"name": name, "source": None, "error": str(error)}


def list_in_subprocess(project: Path | str) -> list[dict[str, Any]]:
    """Every workflow visible from `project`, as the resolver describes them."""
    return _resolver(["list"], Path(project).resolve())


__all__ = [
    "DiscoveredWorkflow",
    "describe_all",
    "describe_one",
    "discover",
    "find",
    "list_in_subprocess",
    "load_from_source",
    "load_workflow_file",
    "resolve_in_subprocess",
]
