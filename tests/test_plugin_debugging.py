"""What a plugin author sees when something is wrong: traces, call order, precise errors."""

from __future__ import annotations

import json

from pi_workflows.testing import WorkflowHome, WorkflowHost

PRIORITY_PLUGIN = """
from pi_workflows import hookimpl


@hookimpl
def piw_select_run_to_claim(candidates, host):
    return None
"""


def test_debug_hooks_traces_a_running_hosts_hook_calls_without_payloads(
    workflow_host: WorkflowHost,
):
    workflow_host.start(PI_WORKFLOWS_DEBUG_HOOKS="1")

    run_id = workflow_host.start_run("hello", {"name": "Secret Sauce"}, session="sess-xyz")
    workflow_host.wait_for_run(run_id)
    workflow_host.wait_for_message("sess-xyz", run_id)

    log = workflow_host.host_log()
    traces = [line for line in log.splitlines() if line.startswith("[pi-workflows hooks]")]
    assert (
        "[pi-workflows hooks] piw_select_run_to_claim(candidates=list[1], host=HostInfo) "
        "calls pi_workflows.builtin.claiming" in traces
    )
    assert "[pi-workflows hooks] piw_select_run_to_claim returned RunRecord" in traces
    assert any(line.startswith("[pi-workflows hooks] piw_worker_run_command(") for line in traces)
    assert any("piw_render_terminal_message(" in line for line in traces)
    assert "Secret Sauce" not in log and "sess-xyz" not in log


def test_plugins_shows_who_answers_each_hook_first(workflow_home: WorkflowHome):
    workflow_home.add_plugin("piw_priority", PRIORITY_PLUGIN)

    text = workflow_home.run_cli("plugins").stdout
    by_hook = json.loads(workflow_home.run_cli("plugins", "--by-hook", "--json").stdout)

    assert "  piw_select_run_to_claim  [firstresult]\n" in text
    assert "      piw_priority -> pi_workflows.builtin.claiming\n" in text
    select = next(hook for hook in by_hook if hook["hook"] == "piw_select_run_to_claim")
    assert select == {
        "hook": "piw_select_run_to_claim",
        "firstresult": True,
        "implementations": ["piw_priority", "pi_workflows.builtin.claiming"],
    }
    may_claim = next(hook for hook in by_hook if hook["hook"] == "piw_may_claim")
    assert may_claim["firstresult"] is False


def test_an_import_error_names_the_file_and_line(workflow_home: WorkflowHome):
    broken = workflow_home.add_plugin(
        "piw_broken_dependency", "from pi_workflows import hookimpl\nimport no_such_module\n"
    )
    syntax = workflow_home.add_plugin("piw_broken_syntax", "def piw_oops(:\n    pass\n")

    result = workflow_home.run_cli("plugins")

    assert result.returncode == 0
    assert (
        "Plugin 'piw_broken_dependency' (named in PI_WORKFLOWS_PLUGINS) failed to load: "
        f"ModuleNotFoundError: No module named 'no_such_module' (at {broken}:2)"
    ) in result.stderr
    assert f"(at {syntax}:1)" in result.stderr


def test_a_misspelt_hook_suggests_the_real_one(workflow_home: WorkflowHome):
    workflow_home.add_plugin(
        "piw_typo",
        "from pi_workflows import hookimpl\n\n\n@hookimpl\n"
        "def piw_selct_run_to_claim(candidates, host):\n    return None\n",
    )

    result = workflow_home.run_cli("plugins")

    assert (
        "unknown hook piw_selct_run_to_claim (did you mean piw_select_run_to_claim?)"
        in result.stderr
    )
    assert "piw_typo  BROKEN" in result.stdout


def test_a_hook_function_without_hookimpl_gets_a_warning(workflow_home: WorkflowHome):
    workflow_home.add_plugin(
        "piw_forgetful", "def piw_unproductive_turn_limit(run, node_id):\n    return 9\n"
    )

    result = workflow_home.run_cli("plugins")

    assert (
        "pi-workflows: warning: plugin 'piw_forgetful' defines piw_unproductive_turn_limit "
        "without @hookimpl, so it is never called; decorate it with pi_workflows.hookimpl."
    ) in result.stderr


def test_describe_hooks_puts_a_later_registered_plugin_first(workflow_plugins):
    from pi_workflows import hookimpl, plugins

    class Impatient:
        @hookimpl
        def piw_unproductive_turn_limit(self, run, node_id):
            return 1

    workflow_plugins.register(Impatient(), name="impatient")

    limit = next(h for h in plugins.describe_hooks() if h["hook"] == "piw_unproductive_turn_limit")
    assert limit["implementations"] == ["impatient", "pi_workflows.builtin.turns"]
