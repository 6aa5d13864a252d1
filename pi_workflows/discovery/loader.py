"""Loading one `<name>.workflow.py` file: execute it and check its `WORKFLOW`.

Only resolver and worker processes call this: importing a workflow file runs its code.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

from ..authoring import Workflow, validate_graph
from ..canonical import sha256_hex
from ..errors import WorkflowDefinitionError

WORKFLOW_SUFFIX = ".workflow.py"
# Compiled workflow files by (path, sha256 of the bytes): the worker fork server fills it
# (compiling runs no user code) so that the workers it forks skip the compile.
_COMPILED: dict[tuple[str, str], types.CodeType] = {}
MAX_COMPILED = 64


def command_name(path: Path) -> str:
    """`triage.workflow.py` → `triage`: the command name is the file stem."""
    return path.name[: -len(WORKFLOW_SUFFIX)]


def file_source(path: Path, content: bytes) -> dict[str, Any]:
    return {"kind": "file", "path": str(path.resolve()), "hash": sha256_hex(content)}


def _one_line(text: str) -> str:
    return " ".join(text.split())


def definition_from_bytes(path: Path, content: bytes) -> Workflow:
    """Execute `content` as the module at `path` and return its checked `WORKFLOW`.

    Every failure is a :class:`WorkflowDefinitionError` whose one line starts with the
    path. Executing the bytes that were hashed (not re-reading the file) keeps the
    source identity honest.
    """
    module_name = f"pi_workflows_file_{sha256_hex(str(path))[:16]}"
    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    try:
        code = _COMPILED.get((str(path), sha256_hex(content))) or compile(
            content, str(path), "exec"
        )
    except SyntaxError as error:
        raise WorkflowDefinitionError(
            f"{path}:{error.lineno}: syntax error: {_one_line(error.msg)}"
        ) from None
    # Registered while executing so dataclasses and pickling can find the module.
    sys.modules[module_name] = module
    try:
        exec(code, module.__dict__)
    except WorkflowDefinitionError as error:
        raise WorkflowDefinitionError(f"{path}: {_one_line(str(error))}") from None
    except SystemExit as error:
        raise WorkflowDefinitionError(
            f"{path}: called sys.exit({error.code!r}) while loading"
        ) from None
    except MemoryError:
        raise WorkflowDefinitionError(f"{path}: ran out of memory while loading") from None
    except Exception as error:
        raise WorkflowDefinitionError(
            f"{path}: {type(error).__name__} while loading: {_one_line(str(error))}"
        ) from None
    finally:
        sys.modules.pop(module_name, None)
    definition = module.__dict__.get("WORKFLOW")
    if definition is None:
        raise WorkflowDefinitionError(f"{path}: defines no module-level WORKFLOW")
    return check_definition_object(definition, str(path))


def precompile(path: Path) -> None:
    """Compile the file at `path` for later loads in this process or its forks (no code
    runs; an unreadable or invalid file is left to the load that reports it)."""
    try:
        content = path.read_bytes()
    except OSError:
        return
    key = (str(path), sha256_hex(content))
    if key in _COMPILED:  # every launch of an unchanged file asks again
        return
    try:
        code = compile(content, str(path), "exec")
    except (SyntaxError, ValueError):
        return
    if len(_COMPILED) >= MAX_COMPILED:
        _COMPILED.clear()
    _COMPILED[key] = code


def check_definition_object(definition: Any, where: str) -> Workflow:
    if not isinstance(definition, Workflow):
        raise WorkflowDefinitionError(
            f"{where}: WORKFLOW is a {type(definition).__name__}, not a workflow(...) definition"
        )
    try:
        validate_graph(definition)
    except WorkflowDefinitionError as error:
        raise WorkflowDefinitionError(f"{where}: {error}") from None
    return definition


def load_workflow_file(path: Path) -> tuple[Workflow, dict[str, Any]]:
    """The definition in `path` and its source identity (absolute path + sha256)."""
    try:
        content = path.read_bytes()
    except OSError as error:
        raise WorkflowDefinitionError(f"{path}: cannot read: {error.strerror}") from None
    return definition_from_bytes(path, content), file_source(path, content)
