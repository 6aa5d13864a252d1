"""The test kit keeps its promises: isolation from installed plugins, records as the host's."""

from __future__ import annotations

import json
from typing import get_type_hints

from pi_workflows import hookimpl, plugins
from pi_workflows.records import AnswerResult, RunRecord, TerminalFacts, TurnReport
from pi_workflows.testing import (
    WorkflowHost,
    channel_context,
    installed_entry_points,
    isolated_plugins,
    run_record,
    terminal_facts,
    turn_report,
)


def test_a_kit_host_loads_no_installed_entry_point_unless_asked(workflow_host: WorkflowHost):
    installed = installed_entry_points()
    assert "audit" in installed  # this repository's suite runs with plugins/ installed
    workflow_host.start()
    isolated = {plugin["name"] for plugin in workflow_host.status()["plugins"]}
    workflow_host.stop()
    workflow_host.use_entry_points("audit")
    workflow_host.start()
    with_audit = {plugin["name"] for plugin in workflow_host.status()["plugins"]}

    assert isolated & set(installed) == set()
    assert with_audit & set(installed) == {"audit"}
    listed = json.loads(workflow_host.cli("plugins", "--json").stdout)
    assert {entry["name"] for entry in listed} & set(installed) == {"audit"}


def test_isolated_plugins_restore_the_process_registry_afterwards():
    class Patient:
        @hookimpl
        def piw_unproductive_turn_limit(self, run, node_id):
            return 10

    before = [name for name, _ in plugins.registry().manager.list_name_plugin()]
    with isolated_plugins() as isolated:
        isolated.register(Patient(), name="patient")
        assert plugins.unproductive_turn_limit(run_record(), "x") == 10
        assert not set(isolated.names()) & set(installed_entry_points())
    after = [name for name, _ in plugins.registry().manager.list_name_plugin()]

    assert after == before and "patient" not in after


def test_factories_build_what_the_host_hands_to_hooks():
    facts = terminal_facts("failed")
    without = terminal_facts(fingerprint=False)
    context = channel_context("hook", options={"url": "x"}, allowed_actors=("ann",))

    assert isinstance(run_record(status="running"), RunRecord)
    assert isinstance(turn_report("start"), TurnReport) and turn_report().stop_reason == "stop"
    assert sorted(facts) == sorted(get_type_hints(TerminalFacts))
    assert "terminalFingerprint" not in without and without["finalOutput"] is not None
    assert facts["error"] and facts["finalOutput"] is None
    assert terminal_facts("failed")["terminalFingerprint"] == facts["terminalFingerprint"]
    assert context.name == "hook" and context.options == {"url": "x"}
    assert context.settings.allows("ann") and not context.settings.allows("bob")
    answer = context.report_answer("d-1", "ship", actor="ann")
    assert sorted(answer) == sorted(get_type_hints(AnswerResult))
    assert context.report_answer.answers == [("d-1", "ship", None, "ann")]
