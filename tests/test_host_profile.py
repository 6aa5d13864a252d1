"""`host status` says what the running host is made of; a client notices other plugins."""

from __future__ import annotations

import json

from pi_workflows.testing import WorkflowHost

LOCAL_PLUGIN = """
from pi_workflows import hookimpl


@hookimpl
def piw_unproductive_turn_limit(run, node_id):
    return None
"""

RESTART_HINT = "restart it: pi-workflows host stop && pi-workflows host start"


def test_status_shows_plugins_database_log_and_executor(workflow_host: WorkflowHost):
    workflow_host.add_plugin("piw_local_limits", LOCAL_PLUGIN)
    workflow_host.start()

    status = json.loads(workflow_host.cli("host", "status", "--json").stdout)
    text = workflow_host.cli("host", "status").stdout

    names = [plugin["name"] for plugin in status["plugins"]]
    assert "piw_local_limits" in names and "pi_workflows.builtin.claiming" in names
    local = next(plugin for plugin in status["plugins"] if plugin["name"] == "piw_local_limits")
    assert local == {
        "name": "piw_local_limits",
        "kind": "env",
        "distribution": None,
        "version": None,
    }
    assert status["database"] == str(workflow_host.home.database_path)
    assert status["logFile"] == str(workflow_host.root / "host.log")
    assert status["agentExecutor"] == {
        "name": "command",
        "registered": True,
        "available": ["command"],
    }
    assert f"database: {workflow_host.home.database_path}" in text
    assert "agent executor: command\n" in text


def test_a_database_password_never_shows(workflow_host: WorkflowHost, postgres_url: str):
    with_password = postgres_url.replace("postgres@", "postgres:hunter2@", 1)
    workflow_host.env["PI_WORKFLOWS_DATABASE"] = with_password
    workflow_host.start(PI_WORKFLOWS_AGENT_EXECUTOR="nobody-registers-this")

    status = json.loads(workflow_host.cli("host", "status", "--json").stdout)
    text = workflow_host.cli("host", "status").stdout

    assert status["database"] == with_password.replace("hunter2", "***")
    assert "hunter2" not in text + json.dumps(status) + workflow_host.host_log()
    assert status["agentExecutor"]["registered"] is False
    assert "agent executor: nobody-registers-this (NOT REGISTERED" in text


def test_a_client_with_other_plugins_than_the_host_says_so(workflow_host: WorkflowHost):
    workflow_host.start()
    same = workflow_host.cli("run", "list", "--json")

    workflow_host.add_plugin("piw_installed_later", LOCAL_PLUGIN)  # after the host started
    differs = workflow_host.cli("run", "list", "--json")

    assert RESTART_HINT not in same.stderr
    assert "the running host loaded a different set of plugins" in differs.stderr
    assert RESTART_HINT in differs.stderr
    workflow_host.stop()
    workflow_host.start()
    assert RESTART_HINT not in workflow_host.cli("run", "list", "--json").stderr
