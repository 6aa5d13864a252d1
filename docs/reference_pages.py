"""The generated reference pages of the documentation site (an mkdocs hook).

One page per hook, built from ``pi_workflows/hookspecs.py`` at every build: signature,
calling convention, the docstring (when it is called, what it must return), the built-in
implementation, an example plugin (``docs/reference/hook-examples/<hook>.py``) and which
distributions under ``plugins/`` implement it. One page for the typed records of
``pi_workflows/records.py``, field by field from their ``#:`` comments, and one for the
event types of ``pi_workflows/event_types.py``, member by member.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import tomllib
import typing
from pathlib import Path
from typing import Any

from pi_workflows import event_types, hookspecs, records
from pi_workflows.builtin import DEFAULT_PLUGINS
from pi_workflows.storage.schema_upgrade import RENAMED_EVENTS

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "reference" / "hook-examples"
HOOK_PAGES = "reference/hooks"
RECORDS_PAGE = "reference/records.md"
EVENTS_PAGE = "reference/events.md"
MARKER = f"{hookspecs.PROJECT_NAME}_impl"


def hook_names() -> list[str]:
    return sorted(hookspecs.CONTRACTS)


def hook_page_path(hook: str) -> str:
    return f"{HOOK_PAGES}/{hook}.md"


def calling_convention(hook: str) -> str:
    """The hook's calling rules, in one paragraph, from its contract (hookspecs.CONTRACTS)."""
    contract = hookspecs.CONTRACTS[hook]
    if contract.kind == "first-result":
        rules = [
            "**first-result**: implementations run from the last registered to the first (the "
            "built-in last); the first that returns something other than `None` decides"
        ]
        if contract.required:
            rules.append(
                "an answer is **required**: when every implementation returns `None` the core "
                "raises one sentence naming the hook (and its built-in, if disabled)"
            )
    elif contract.kind == "collect":
        rules = ["**collect**: every implementation runs and contributes an answer"]
    else:
        rules = [
            "**notification**: every implementation is told; return values are ignored and an "
            "exception is logged with the plugin's name, never raised"
        ]
    if contract.isolated:
        rules.append(
            "each implementation is called **on its own**: one that raises is reported by name "
            "and the others still run (a plugin that wraps this hook is refused)"
        )
    if contract.deadline:
        rules.append(
            "called on a helper thread under the **hook deadline** "
            "(`PI_WORKFLOWS_HOOK_TIMEOUT_MS`, default 1000 ms): a plugin past it is left "
            "out until its call returns"
        )
    if contract.transaction == "inside":
        rules.append(
            "called **inside** the state-store transaction of the change it decides: use only "
            "what it is given"
        )
    else:
        rules.append("called **outside** any state-store transaction")
    return "; ".join(rules) + f". Returns `{contract.returns}`."


def builtin_implementations(hook: str) -> list[str]:
    return [
        module
        for module in DEFAULT_PLUGINS
        if hasattr(getattr(importlib.import_module(module), hook, None), MARKER)
    ]


def distribution_implementations() -> dict[str, list[str]]:
    """Hook name → distributions under plugins/ whose package defines it with @hookimpl."""
    found: dict[str, list[str]] = {}
    for pyproject in sorted(ROOT.glob("plugins/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())
        distribution = project["project"]["name"]
        entry_points = project["project"].get("entry-points", {}).get("pi_workflows", {})
        packages = {value.split(".")[0] for value in entry_points.values()}
        for package in sorted(packages):
            for source in sorted((pyproject.parent / package).rglob("*.py")):
                for hook in _decorated_hooks(source):
                    names = found.setdefault(hook, [])
                    if distribution not in names:
                        names.append(distribution)
    return found


def _contract_source(hook: str) -> str:
    """The contract as the spec declares it in hookspecs.py (`@hook(...)`)."""
    source = inspect.getsource(hookspecs)
    spec = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == hook
    )
    (decorator,) = spec.decorator_list
    assert isinstance(decorator, ast.Call)
    return ast.get_source_segment(source, decorator.args[0]) or ""


def _decorated_hooks(source: Path) -> list[str]:
    tree = ast.parse(source.read_text())
    return [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("piw_")
        and any("hookimpl" in ast.unparse(decorator) for decorator in node.decorator_list)
    ]


def hook_page(hook: str, implemented_by: dict[str, list[str]]) -> str:
    spec = getattr(hookspecs, hook)
    signature = str(inspect.signature(spec)).replace("'", "")
    example = EXAMPLES / f"{hook}.py"
    if not example.exists():
        raise FileNotFoundError(f"hook {hook} has no example plugin: write {example}")
    builtins = builtin_implementations(hook)
    builtin_text = ", ".join(f"`{module}`" for module in builtins) or "none"
    distributions = implemented_by.get(hook, [])
    distribution_text = ", ".join(f"`{name}`" for name in distributions) or "none"
    return "\n".join(
        [
            f"# `{hook}`",
            "",
            "```python",
            f"@hook({_contract_source(hook)})",
            f"def {hook}{signature}",
            "```",
            "",
            calling_convention(hook),
            "",
            "## Contract",
            "",
            _docstring_markdown(inspect.getdoc(spec) or ""),
            "",
            f"**Built-in implementation:** {builtin_text}.",
            "",
            f"**Implemented by the distributions in `plugins/`:** {distribution_text}.",
            "",
            "## Example plugin",
            "",
            "```python",
            example.read_text().rstrip(),
            "```",
            "",
            "Test it with the test kit (`pi_workflows.testing`): register it with the "
            "`workflow_plugins` fixture and call the hook's façade in `pi_workflows.plugins`, "
            "or load it into a real host with `workflow_host.add_plugin(...)`; see "
            "[Writing plugins](../../plugins.md#testing-a-plugin), whose "
            "[recipes](../../plugins.md#recipes) show how to give the host settings "
            '(`workflow_host.start(PI_WORKFLOWS_MAX_WORKERS="1")`), start runs with options '
            "and write configuration files.",
            "",
        ]
    )


def _docstring_markdown(doc: str) -> str:
    """Sphinx-style roles and fields, readable as Markdown."""
    text = doc.replace(":class:`~pi_workflows.records.", "`").replace(":data:`~", "`")
    text = text.replace(":class:`", "`").replace(":func:`", "`").replace(":data:`", "`")
    lines = []
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(":param "):
            name, _, rest = stripped.removeprefix(":param ").partition(":")
            line = f"- **`{name}`**:{rest}"
        elif stripped.startswith(":returns:"):
            line = f"- **returns**:{stripped.removeprefix(':returns:')}"
        elif line.startswith("    ") and lines and lines[-1].startswith("- "):
            line = "  " + stripped
        lines.append(line.replace("``", "`"))
    return "\n".join(lines)


def hooks_index(implemented_by: dict[str, list[str]]) -> str:
    rows = [
        "# Hook reference",
        "",
        "Every hook of `pi_workflows/hookspecs.py`, generated from the specifications. A "
        "plugin implements a hook with a function of the same name decorated with "
        "`pi_workflows.hookimpl`; `pi-workflows plugins` shows who answers each hook first.",
        "",
        "| hook | calling convention | built-in | in `plugins/` |",
        "|---|---|---|---|",
    ]
    for hook in hook_names():
        convention = calling_convention(hook).split("**")[1]
        builtins = ", ".join(m.rsplit(".", 1)[1] for m in builtin_implementations(hook)) or "—"
        distributions = ", ".join(implemented_by.get(hook, [])) or "—"
        rows.append(f"| [`{hook}`]({hook}.md) | {convention} | {builtins} | {distributions} |")
    return "\n".join(rows) + "\n"


def records_page() -> str:
    source = inspect.getsource(records)
    parts = [
        "# Typed records",
        "",
        "What hooks receive and return (`pi_workflows.records`). Dataclasses are frozen "
        "values; TypedDicts are the JSON objects hooks get, plain dicts at run time.",
        "",
    ]
    for name, value in vars(records).items():
        if (
            not inspect.isclass(value)
            or value.__module__ != records.__name__
            or name.startswith("_")
        ):
            continue
        kind = "dataclass" if dataclasses.is_dataclass(value) else "TypedDict"
        parts += [f"## `{name}` ({kind})", "", inspect.getdoc(value) or "", ""]
        parts += ["| field | type | meaning |", "|---|---|---|"]
        comments = _field_comments(source, name)
        optional = getattr(value, "__optional_keys__", frozenset())
        for field_name, annotation in _annotations(value).items():
            shown = annotation.replace("|", "\\|") + (
                " (optional)" if field_name in optional else ""
            )
            meaning = comments.get(field_name, "").replace("|", "\\|")
            parts.append(f"| `{field_name}` | `{shown}` | {meaning} |")
        parts.append("")
    parts += [
        "## `ChannelDelivery`",
        "",
        "`dict[str, Any] | None`: what a channel's `deliver` returned (kept as JSON); "
        "`settle` gets it back.",
        "",
    ]
    return "\n".join(parts)


def events_page() -> str:
    """Every event type a run's history may hold, in the groups of its enum, with what its
    payload holds; then the names schema v4 renamed."""
    source = inspect.getsource(event_types.EventType)
    comments = _field_comments(source, "EventType")
    parts = [
        "# Event types",
        "",
        "Every change of a run bumps its revision and appends one event (`events` table): "
        "its type is one of these (`pi_workflows.event_types.EventType`). The audit "
        "plugin's `audit events` lists them, `run watch --json` shows the engine's run "
        "events, and `piw_run_transition` gets the type of the change as its detail when it "
        "has no status detail. What the payload holds follows each meaning in parentheses.",
    ]
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("# ---"):
            heading = stripped.strip("#- ")
            parts += ["", f"## {heading[0].upper()}{heading[1:]}", ""]
            parts += ["| type | meaning |", "|---|---|"]
        elif stripped.split(" = ")[0] in comments:
            member = event_types.EventType[stripped.split(" = ")[0]]
            meaning = comments[member.name].replace("|", "\\|")
            parts.append(f"| `{member.value}` | {meaning} |")
    parts += [
        "",
        "## Names before schema v4",
        "",
        "Schema v4 gave the engine's events the one style the others had. A host that opens "
        "an older database renames its stored events (`events.event_type`) in the upgrade's "
        "transaction; an engine event's payload keeps the trace event as it was written, "
        "old name included.",
        "",
        "| before v4 | from v4 |",
        "|---|---|",
        *(f"| `{old}` | `{new.value}` |" for old, new in RENAMED_EVENTS.items()),
        "",
    ]
    return "\n".join(parts)


def _annotations(record: type) -> dict[str, str]:
    raw = typing.get_type_hints(record)
    return {
        name: str(hint).replace("typing.", "").replace("NotRequired[", "")[:-1]
        if "NotRequired" in str(hint)
        else _type_name(hint)
        for name, hint in raw.items()
    }


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _field_comments(source: str, class_name: str) -> dict[str, str]:
    """``#:`` comment lines right above each field of `class_name`, joined."""
    lines = source.splitlines()
    start = next(
        i
        for i, line in enumerate(lines)
        if line.startswith((f"class {class_name}(", f"class {class_name}:"))
    )
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in lines[start + 1 :]:
        if line and not line.startswith(" "):
            break
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped.removeprefix("#:").strip())
        elif (":" in stripped or " = " in stripped) and not stripped.startswith(
            ("#", '"', "def ", "@")
        ):
            # A record's field (`name: type`) or an enum's member (`NAME = "value"`).
            field_name = stripped.split(":")[0].split(" = ")[0]
            if field_name.isidentifier():
                comments[field_name] = " ".join(pending)
            pending = []
        elif not stripped.startswith("#"):
            pending = []
    return comments


def pages() -> dict[str, str]:
    """Every generated page: path under docs/ → Markdown."""
    implemented_by = distribution_implementations()
    generated = {f"{HOOK_PAGES}/index.md": hooks_index(implemented_by)}
    for hook in hook_names():
        generated[hook_page_path(hook)] = hook_page(hook, implemented_by)
    generated[RECORDS_PAGE] = records_page()
    generated[EVENTS_PAGE] = events_page()
    return generated


# --- mkdocs hooks ------------------------------------------------------------------------


def on_config(config: Any) -> Any:
    """Put every hook page in the navigation, under the hook reference's index."""
    for section in config["nav"]:
        if isinstance(section, dict) and "Reference" in section:
            section["Reference"] = [
                {"Hooks": [f"{HOOK_PAGES}/index.md", *map(hook_page_path, hook_names())]},
                {"Typed records": RECORDS_PAGE},
                {"Event types": EVENTS_PAGE},
            ]
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path, content in pages().items():
        files.append(File.generated(config, path, content=content))
    return files
