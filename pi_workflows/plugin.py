"""The public namespace for plugins: everything a plugin may import, in one place.

A plugin imports from here (and its tests from :mod:`pi_workflows.testing`); the
workflows it registers use the authoring API of :mod:`pi_workflows` itself (``workflow``,
``compute``, …). Every other ``pi_workflows`` module is internal and may change without
notice.

Names are imported on first use, like :mod:`pi_workflows` itself: a plugin module is
loaded whenever the command line starts, and one that only needs ``hookimpl`` must not
make ``pi-workflows --version`` pay for the state store or the client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .plugin_imports import PUBLIC_SOURCES

# name -> the internal module that defines it (relative to pi_workflows); kept beside the
# check that tells plugins on internal modules which of their names moved here.
_SOURCES = PUBLIC_SOURCES
_RENAMED = {"setting_value": "value"}

# Spelled out (not derived from _SOURCES) so linters and type checkers can read it.
__all__ = [
    "APP_NAME",
    "AbortSignal",
    "AgentExecutor",
    "AgentExecutorError",
    "AgentStepRequest",
    "AgentStepResult",
    "AgentTranscript",
    "AnswerNotAllowedError",
    "AnswerResult",
    "ChannelConfigError",
    "ChannelContext",
    "ChannelDelivery",
    "ChannelDeliveryError",
    "ChannelFactory",
    "ChannelGaveUp",
    "ChannelRequest",
    "ChannelSettings",
    "Claim",
    "CliContext",
    "DecisionChoice",
    "DecisionResolution",
    "EarlierOutcome",
    "GUARDRAILS",
    "HostConnection",
    "HostInfo",
    "HostUnavailableError",
    "InvalidInputError",
    "MessageContent",
    "NodeAttemptRecord",
    "NodeAborted",
    "NotFoundError",
    "PREAMBLE",
    "SafetySentences",
    "PiWorkflowsError",
    "RegisterChannel",
    "RunRecord",
    "StateView",
    "StepContract",
    "TerminalFacts",
    "TurnConflictError",
    "TurnContext",
    "TurnReceipt",
    "TurnReport",
    "UnsafeHomeError",
    "WorkerLaunchEnvelope",
    "WorkerProcessSpec",
    "WorkerRunCommand",
    "WorkerSettings",
    "bounded_terminal_facts",
    "canonical_json",
    "config_dir",
    "default_step_prompt",
    "default_worker_process",
    "emit_json",
    "ensure_private_dir",
    "event_counts",
    "hookimpl",
    "json_option",
    "pass_cli",
    "run_events",
    "run_exists",
    "safety_sentences",
    "setting_value",
    "start_payload",
    "state_view",
    "start_registered",
    "state_status",
    "unregister",
]


def default_step_prompt(contract: StepContract, authored: str) -> str:
    """The built-in ``piw_step_prompt``, for a plugin that wraps it.

    A plugin must not import the built-in hook function under its own name: pluggy
    would register it again, as the plugin's.
    """
    from .builtin import step_prompt

    return step_prompt.piw_step_prompt(contract, authored)


def default_worker_process(
    envelope: WorkerLaunchEnvelope, settings: WorkerSettings
) -> WorkerProcessSpec:
    """The built-in ``piw_worker_process``, for a plugin that wraps it."""
    from .builtin import launch

    return launch.piw_worker_process(envelope, settings)


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(source, "pi_workflows")
    value = getattr(module, _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from .bounded_values import bounded_terminal_facts
    from .builtin.terminal import GUARDRAILS, PREAMBLE
    from .canonical import canonical_json
    from .cli.context import CliContext, emit_json, json_option, pass_cli
    from .client.connection import HostConnection
    from .client.start_request import start_payload
    from .engine.agents import AgentExecutor, AgentExecutorError, AgentTranscript
    from .engine.context import AbortSignal, NodeAborted
    from .engine.processes import start_registered, unregister
    from .errors import (
        AnswerNotAllowedError,
        ChannelConfigError,
        ChannelDeliveryError,
        HostUnavailableError,
        InvalidInputError,
        NotFoundError,
        PiWorkflowsError,
        TurnConflictError,
        UnsafeHomeError,
    )
    from .home import APP_NAME, config_dir, ensure_private_dir
    from .hookspecs import hookimpl
    from .records import (
        AgentStepRequest,
        AgentStepResult,
        AnswerResult,
        ChannelContext,
        ChannelDelivery,
        ChannelFactory,
        ChannelGaveUp,
        ChannelRequest,
        ChannelSettings,
        Claim,
        DecisionChoice,
        DecisionResolution,
        EarlierOutcome,
        HostInfo,
        MessageContent,
        NodeAttemptRecord,
        RegisterChannel,
        RunRecord,
        StepContract,
        TerminalFacts,
        TurnContext,
        TurnReceipt,
        TurnReport,
        WorkerLaunchEnvelope,
        WorkerProcessSpec,
        WorkerRunCommand,
        WorkerSettings,
    )
    from .safety_wording import SafetySentences, safety_sentences
    from .settings import value as setting_value
    from .storage import event_counts, run_events, run_exists, state_status
    from .storage.state_view import StateView, state_view
