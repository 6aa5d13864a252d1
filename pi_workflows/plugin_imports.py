"""Which `pi_workflows` imports a plugin may make, and the warning for the ones it may not.

Plugins import :mod:`pi_workflows.plugin` (their tests also :mod:`pi_workflows.testing`)
and the authoring names of :mod:`pi_workflows`; every other module is internal. Plugins
written before the public namespace existed imported internal modules (``cli.context``,
``storage``, ``engine.*``, ``builtin.terminal``): those imports still work for one
release, and loading such a plugin warns, naming what to import instead.
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Iterator
from types import ModuleType

# The public names of pi_workflows.plugin -> the internal module that defines each
# (relative to pi_workflows).
PUBLIC_SOURCES: dict[str, str] = {
    # marking hook implementations
    "hookimpl": ".hookspecs",
    # reading the state (running runs, queue depth, a run) from any hook or thread
    "StateView": ".storage.state_view",
    "state_view": ".storage.state_view",
    # the records hooks receive and return
    **{
        name: ".records"
        for name in (
            "AgentStepRequest",
            "AgentStepResult",
            "AnswerResult",
            "ChannelContext",
            "ChannelDelivery",
            "ChannelFactory",
            "ChannelGaveUp",
            "ChannelRequest",
            "ChannelSettings",
            "Claim",
            "DecisionChoice",
            "DecisionResolution",
            "EarlierOutcome",
            "HostInfo",
            "MessageContent",
            "NodeAttemptRecord",
            "RegisterChannel",
            "RunRecord",
            "StepContract",
            "TerminalFacts",
            "TurnContext",
            "TurnReceipt",
            "TurnReport",
            "WorkerLaunchEnvelope",
            "WorkerProcessSpec",
            "WorkerRunCommand",
            "WorkerSettings",
        )
    },
    # errors a plugin raises or catches
    **{
        name: ".errors"
        for name in (
            "AnswerNotAllowedError",
            "ChannelConfigError",
            "ChannelDeliveryError",
            "HostUnavailableError",
            "InvalidInputError",
            "NotFoundError",
            "PiWorkflowsError",
            "TurnConflictError",
            "UnsafeHomeError",
        )
    },
    # agent executors (piw_register_agent_executors)
    "AgentExecutor": ".engine.agents",
    "AgentExecutorError": ".engine.agents",
    "AgentTranscript": ".engine.agents",
    "AbortSignal": ".engine.context",
    "NodeAborted": ".engine.context",
    "start_registered": ".engine.processes",
    "unregister": ".engine.processes",
    # terminal messages (piw_render_terminal_message): the safety sentences every
    # rendering keeps, and the cutter that bounds quoted values
    "GUARDRAILS": ".builtin.terminal",
    "PREAMBLE": ".builtin.terminal",
    "SafetySentences": ".safety_wording",
    "safety_sentences": ".safety_wording",
    "bounded_terminal_facts": ".bounded_values",
    "canonical_json": ".canonical",
    # command-line extension (piw_register_commands)
    "CliContext": ".cli.context",
    "emit_json": ".cli.context",
    "json_option": ".cli.context",
    "pass_cli": ".cli.context",
    "HostConnection": ".client.connection",
    "start_payload": ".client.start_request",
    # read-only state queries for commands
    "event_counts": ".storage",
    "run_events": ".storage",
    "run_exists": ".storage",
    "state_status": ".storage",
    # the home and settings
    "APP_NAME": ".home",
    "config_dir": ".home",
    "ensure_private_dir": ".home",
    "setting_value": ".settings",
}
PUBLIC_MODULES = frozenset({"pi_workflows.plugin", "pi_workflows.testing"})
# A cheap look before parsing: a module that imports no other pi_workflows module is fine.
_INTERNAL = re.compile(
    r"^\s*(?:from|import)\s+pi_workflows(?!\.(?:plugin|testing)\b)[\s.]", re.MULTILINE
)


def _authoring_names() -> set[str]:
    import pi_workflows

    return set(pi_workflows.__all__) - {"__version__"}


def internal_imports(source: str) -> Iterator[tuple[str, list[str]]]:
    """`(module, names)` of every `pi_workflows` import in `source` outside the public
    namespace (`names` is empty for a plain `import pi_workflows.x`)."""
    if not _INTERNAL.search(source):
        return
    import ast  # only for a module that imports another pi_workflows module

    authoring = _authoring_names()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pi_workflows") and alias.name not in PUBLIC_MODULES:
                    yield alias.name, []
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pi_workflows"):
            names = sorted(alias.name for alias in node.names)
            if node.module in PUBLIC_MODULES:
                continue
            if node.module == "pi_workflows" and set(names) <= authoring:
                continue
            yield str(node.module), names


def deprecation_notices(plugin_name: str, plugin: object) -> list[str]:
    """One sentence per internal import in the module of a loaded plugin: what it
    imports, and from where to import it now (or that it has no public name)."""
    module = plugin if isinstance(plugin, ModuleType) else sys.modules.get(plugin.__module__)
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return []
    try:
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        found = list(internal_imports(source))
    except (OSError, SyntaxError, ValueError):
        return []  # what cannot be read is not judged
    notices = []
    for module_name, names in found:
        moved = [name for name in names if name in PUBLIC_SOURCES]
        stay = [name for name in names if name not in PUBLIC_SOURCES]
        what = f"plugin {plugin_name!r} imports"
        if moved:
            notices.append(
                f"{what} {', '.join(moved)} from {module_name}, an internal module: import "
                f"{'them' if len(moved) > 1 else 'it'} from pi_workflows.plugin instead; "
                "internal imports stop working for plugins in the next release."
            )
        if stay or not names:
            shown = f"{', '.join(stay)} from {module_name}" if stay else module_name
            notices.append(
                f"{what} {shown}, which is internal and not part of the plugin API "
                "(pi_workflows.plugin): it may change or go in the next release."
            )
    return notices


def warn_about_internal_imports(plugin_name: str, plugin: object) -> None:
    """Warn, on stderr and as a DeprecationWarning, about each internal import."""
    for notice in deprecation_notices(plugin_name, plugin):
        print(f"pi-workflows: warning: {notice}", file=sys.stderr)
        warnings.warn(notice, DeprecationWarning, stacklevel=2)
