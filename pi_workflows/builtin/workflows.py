"""Built-in workflow discovery: the example workflows and the standard directories."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..discovery.loader import load_workflow_file
from ..home import config_dir
from ..hookspecs import hookimpl

EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"
BUILTIN_WORKFLOWS = ("hello", "shell", "echo", "branch", "two-turn", "human-decision")


@hookimpl
def piw_register_workflows(register: Callable[..., None]) -> None:
    for name in BUILTIN_WORKFLOWS:
        definition, source = load_workflow_file(EXAMPLES_DIR / f"{name}.workflow.py")
        # The file hash is the revision: a resumed run refuses an edited built-in.
        register(name, definition, revision=source["hash"])


@hookimpl
def piw_workflow_dirs(project: Path) -> list[Path]:
    return [project / ".pi" / "workflows", config_dir() / "workflows"]
