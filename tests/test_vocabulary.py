"""One word per concept: event types, worker operations and kinds and progress kinds are
spelt only in their enums (pi_workflows/event_types.py, pi_workflows/protocol/), never as
bare string literals in the code that writes or reads them."""

from __future__ import annotations

import ast
from pathlib import Path

from pi_workflows.event_types import EventType
from pi_workflows.protocol.client_messages import ProgressKind
from pi_workflows.protocol.worker_messages import WorkerKind, WorkerOperation
from pi_workflows.storage.schema_upgrade import RENAMED_EVENTS

ROOT = Path(__file__).resolve().parents[1]
# Where the words are defined (each module names its own enum's values once), and the
# schema upgrade that renames the event types older schemas stored.
DEFINITIONS = {
    "pi_workflows/event_types.py",
    "pi_workflows/protocol/worker_messages.py",
    "pi_workflows/protocol/client_messages.py",
    "pi_workflows/storage/schema_upgrade.py",
}


def vocabulary() -> dict[str, str]:
    """Each word -> the enum member that spells it (an event's name before schema v4
    too: a reader that compares with it finds nothing any more)."""
    words = {old: f"EventType.{new.name}" for old, new in RENAMED_EVENTS.items()}
    for enum in (EventType, WorkerOperation, WorkerKind, ProgressKind):
        for member in enum:
            # "run" and "update" are ordinary words too (a trace event's scope, say).
            if not member.value.isalpha() or not member.value.islower():
                words[member.value] = f"{enum.__name__}.{member.name}"
    return words


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings (prose may name a word)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(
            node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
        ) and (docstring := ast.get_docstring(node, clean=False)):
            first = node.body[0]
            assert isinstance(first, ast.Expr) and first.value.value == docstring
            found.add(id(first.value))
    return found


def bare_words(path: Path, words: dict[str, str], root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    docstrings = _docstrings(tree)
    return [
        f"{path.relative_to(root)}:{node.lineno}: {node.value!r} (use {words[node.value]})"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in words
        and id(node) not in docstrings
    ]


def shipped_sources() -> list[Path]:
    sources = sorted((ROOT / "pi_workflows").rglob("*.py"))
    sources += sorted(ROOT.glob("plugins/*/piw_*/**/*.py"))
    return [path for path in sources if str(path.relative_to(ROOT)) not in DEFINITIONS]


def test_no_event_type_operation_or_kind_is_spelt_outside_its_enum():
    words = vocabulary()
    found = [line for path in shipped_sources() for line in bare_words(path, words)]

    assert found == [], "\n".join(found)


def test_the_scan_finds_a_bare_event_type(tmp_path: Path):
    # The check itself: a module that compares with the stored text, or with the name an
    # older schema stored, is caught, with the member to use instead; a docstring that
    # names the event is not.
    module = tmp_path / "probe.py"
    module.write_text(
        f'"""Reads {EventType.RUN_PAUSED.value} events."""\n'
        f"def paused(event_type):\n    return event_type == {EventType.RUN_PAUSED.value!r}\n"
        "def started(event_type):\n    return event_type == 'node_started'\n"
    )

    found = bare_words(module, vocabulary(), root=tmp_path)

    assert found == [
        f"probe.py:3: {EventType.RUN_PAUSED.value!r} (use EventType.RUN_PAUSED)",
        "probe.py:5: 'node_started' (use EventType.NODE_STARTED)",
    ]
