"""The test kit keeps its promises: isolation from installed plugins, records as the host's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import get_type_hints

import psutil

from pi_workflows import hookimpl, plugins
from pi_workflows.records import AnswerResult, RunRecord, TerminalFacts, TurnReport
from pi_workflows.testing import (
    InProcessHost,
    WorkflowHost,
    channel_context,
    installed_entry_points,
    isolated_plugins,
    run_record,
    terminal_facts,
    turn_report,
)
from pi_workflows.testing import host as kit_host


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


HELLO_PLUGIN = """
from pi_workflows import hookimpl


@hookimpl
def piw_unproductive_turn_limit(run, node_id):
    return None
"""


def test_an_in_process_host_runs_real_workers_and_gives_the_process_back(
    in_process_host: InProcessHost,
):
    environ_before = dict(os.environ)
    plugins_before = {entry["name"] for entry in plugins.describe_plugins()}
    in_process_host.add_plugin("kit_probe", HELLO_PLUGIN)
    in_process_host.start(PI_WORKFLOWS_MAX_WORKERS="2")

    run_id = in_process_host.start_run("hello", {"name": "Ada"})
    status = in_process_host.wait_for_run(run_id)
    assert status["finalOutput"] == {"greeting": "Hello, Ada!"}
    host_status = in_process_host.status()
    assert host_status["maxWorkers"] == 2
    assert "kit_probe" in {plugin["name"] for plugin in host_status["plugins"]}
    # The run's worker was a process of its own, not this one.
    [(worker_pid,)] = in_process_host.query("SELECT pid FROM run_workers WHERE run_id = ?", run_id)
    assert worker_pid != os.getpid()

    in_process_host.stop()
    assert dict(os.environ) == environ_before
    assert {entry["name"] for entry in plugins.describe_plugins()} == plugins_before
    assert not in_process_host.home.socket_path.exists()


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


def test_cleanup_passes_over_a_worker_that_exited_while_it_was_killing_the_tree(monkeypatch):
    # The model soak found it: a host stopping ends its workers while cleanup walks them.
    parent = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_process = psutil.Process(gone.pid)
    gone.wait()
    monkeypatch.setattr(psutil.Process, "children", lambda self, recursive=False: [gone_process])
    try:
        kit_host._kill_tree(parent.pid)
        assert parent.wait(timeout=30) == -signal.SIGKILL
    finally:
        parent.kill()
