"""Loading plugins: order, override, disabling, local modules and broken plugins."""

from __future__ import annotations

import json
import logging
import textwrap

import pytest

from pi_workflows import hookimpl, plugins
from pi_workflows.builtin import DEFAULT_PLUGINS, ESSENTIAL_PLUGINS
from pi_workflows.errors import PluginError
from pi_workflows.storage import open_state

TURNS = "pi_workflows.builtin.turns"


def _write_module(directory, name: str, source: str) -> None:
    (directory / f"{name}.py").write_text(textwrap.dedent(source))


class StricterTurns:
    @hookimpl
    def piw_unproductive_turn_limit(self, run, node_id):
        return 1


def test_builtins_register_first_in_their_declared_order(audit_plugin):
    registry = plugins.registry()
    names = [name for name, _ in registry.manager.list_name_plugin()]

    assert names[: len(DEFAULT_PLUGINS)] == list(DEFAULT_PLUGINS)
    assert names.index(audit_plugin) > max(names.index(name) for name in DEFAULT_PLUGINS)


def test_a_temporary_firstresult_plugin_overrides_the_builtin_until_unregistered(run_record):
    run = run_record()
    assert plugins.unproductive_turn_limit(run, "step") == 3

    with plugins.temporary_plugin(StricterTurns(), name="stricter") as name:
        assert name == "stricter"
        assert plugins.unproductive_turn_limit(run, "step") == 1
        assert "stricter" in [entry["name"] for entry in plugins.describe_plugins()]

    assert plugins.unproductive_turn_limit(run, "step") == 3
    assert "stricter" not in [entry["name"] for entry in plugins.describe_plugins()]


def test_a_plugin_returning_none_defers_to_the_builtin(run_record):
    class Undecided:
        @hookimpl
        def piw_unproductive_turn_limit(self, run, node_id):
            return None

    with plugins.temporary_plugin(Undecided()):
        assert plugins.unproductive_turn_limit(run_record(), "step") == 3


def test_the_disable_list_blocks_builtins_but_not_essential_ones(monkeypatch, run_record):
    monkeypatch.setenv(plugins.DISABLE_ENV, f" {TURNS} , {ESSENTIAL_PLUGINS[0]},")

    registry = plugins.load_plugins()

    assert registry.disabled == [TURNS]
    assert not registry.manager.has_plugin(TURNS)
    assert registry.manager.has_plugin(ESSENTIAL_PLUGINS[0])
    assert registry.manager.hook.piw_unproductive_turn_limit(run=run_record(), node_id="x") is None


def test_the_disable_list_in_the_cli(home_env, audit_plugin):
    result = home_env.run_cli(
        "plugins", "--json", env={plugins.DISABLE_ENV: f"{TURNS},{audit_plugin}"}
    )

    assert result.returncode == 0, result.stderr
    names = [entry["name"] for entry in json.loads(result.stdout)]
    assert TURNS not in names and audit_plugin not in names
    assert "pi_workflows.builtin.storage" in names
    disabled_audit = home_env.run_cli("audit", "summary", env={plugins.DISABLE_ENV: audit_plugin})
    assert disabled_audit.returncode == 2  # the command no longer exists


def test_a_local_module_named_in_the_env_is_loaded_last(tmp_path, monkeypatch, run_record):
    _write_module(
        tmp_path,
        "piw_local_limits",
        """
        from pi_workflows import hookimpl

        @hookimpl
        def piw_unproductive_turn_limit(run, node_id):
            return 7 if node_id == "patient" else None
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(plugins.PLUGINS_ENV, "piw_local_limits")

    registry = plugins.load_plugins()

    names = [name for name, _ in registry.manager.list_name_plugin()]
    assert names[-1] == "piw_local_limits"
    assert registry.sources["piw_local_limits"].kind == "env"
    hook = registry.manager.hook.piw_unproductive_turn_limit
    assert hook(run=run_record(), node_id="patient") == 7
    assert hook(run=run_record(), node_id="other") == 3


@pytest.mark.hook_effect("piw_register_commands")
def test_a_local_plugin_through_the_cli(home_env, tmp_path):
    _write_module(
        tmp_path,
        "piw_cli_local",
        """
        import click
        from pi_workflows import hookimpl

        @click.command("greet")
        def greet():
            \"\"\"Say hello from a local plugin.\"\"\"
            click.echo("hello from a local plugin")

        @hookimpl
        def piw_register_commands(cli):
            cli.add_command(greet)
        """,
    )
    env = {plugins.PLUGINS_ENV: "piw_cli_local", "PYTHONPATH": str(tmp_path)}

    listed = home_env.run_cli("plugins", "--json", env=env)
    greeted = home_env.run_cli("greet", env=env)

    entry = next(e for e in json.loads(listed.stdout) if e["name"] == "piw_cli_local")
    assert entry["kind"] == "env" and entry["hooks"] == ["piw_register_commands"]
    assert greeted.returncode == 0 and greeted.stdout == "hello from a local plugin\n"


def test_a_plugin_importing_internal_modules_is_told_what_to_import_instead(home_env, tmp_path):
    # Written before pi_workflows.plugin existed: the imports still work this release.
    _write_module(
        tmp_path,
        "piw_old_paths",
        """
        import pi_workflows.engine.runner
        from pi_workflows.cli.context import emit_json, pass_cli
        from pi_workflows.host.slots import WorkerSlots
        from pi_workflows import hookimpl
        from pi_workflows.plugin import RunRecord

        @hookimpl
        def piw_unproductive_turn_limit(run, node_id):
            return 7
        """,
    )
    _write_module(tmp_path, "piw_new_paths", "from pi_workflows.plugin import hookimpl\n")
    env = {plugins.PLUGINS_ENV: "piw_old_paths,piw_new_paths", "PYTHONPATH": str(tmp_path)}

    listed = home_env.run_cli("plugins", "--json", env=env)

    assert listed.returncode == 0
    names = {entry["name"] for entry in json.loads(listed.stdout)}
    assert {"piw_old_paths", "piw_new_paths"} <= names  # both load and work
    assert listed.stderr.splitlines() == [
        "pi-workflows: warning: plugin 'piw_old_paths' imports pi_workflows.engine.runner, "
        "which is internal and not part of the plugin API (pi_workflows.plugin): it may "
        "change or go in the next release.",
        "pi-workflows: warning: plugin 'piw_old_paths' imports emit_json, pass_cli from "
        "pi_workflows.cli.context, an internal module: import them from pi_workflows.plugin "
        "instead; internal imports stop working for plugins in the next release.",
        "pi-workflows: warning: plugin 'piw_old_paths' imports WorkerSlots from "
        "pi_workflows.host.slots, which is internal and not part of the plugin API "
        "(pi_workflows.plugin): it may change or go in the next release.",
    ]


def test_an_internal_import_is_a_deprecation_warning_in_a_plugins_own_tests(tmp_path, monkeypatch):
    _write_module(tmp_path, "piw_old_storage", "from pi_workflows.storage import state_status\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(plugins.PLUGINS_ENV, "piw_old_storage")

    with pytest.warns(DeprecationWarning, match="import it from pi_workflows.plugin instead"):
        plugins.load_plugins()


def test_a_plugin_failing_at_import_is_named_and_the_cli_keeps_working(home_env, tmp_path):
    _write_module(tmp_path, "piw_broken_import", "raise RuntimeError('missing api key')\n")
    env = {plugins.PLUGINS_ENV: "piw_broken_import", "PYTHONPATH": str(tmp_path)}
    open_state(home_env.home).close()

    status = home_env.run_cli("state", "status", "--json", env=env)
    listed = home_env.run_cli("plugins", "--json", env=env)

    assert status.returncode == 0
    assert json.loads(status.stdout)["schemaName"] == "pi-workflows-state"
    assert "Plugin 'piw_broken_import'" in status.stderr
    assert "RuntimeError: missing api key" in status.stderr
    assert f"{plugins.DISABLE_ENV}=piw_broken_import" in status.stderr
    broken = [e for e in json.loads(listed.stdout) if e["kind"] == "broken"]
    assert [e["name"] for e in broken] == ["piw_broken_import"]
    assert "missing api key" in broken[0]["error"]
    quiet = home_env.run_cli(
        "state", "status", env={**env, plugins.DISABLE_ENV: "piw_broken_import"}
    )
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_a_misspelt_hook_is_reported_against_its_plugin(tmp_path, monkeypatch, capsys):
    _write_module(
        tmp_path,
        "piw_misspelt",
        """
        from pi_workflows import hookimpl

        @hookimpl
        def piw_unproductive_turn_limt(run, node_id):
            return 1
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(plugins.PLUGINS_ENV, "piw_misspelt")

    registry = plugins.load_plugins()

    assert not registry.manager.has_plugin("piw_misspelt")
    assert [error.plugin_name for error in registry.load_errors] == ["piw_misspelt"]
    assert "piw_unproductive_turn_limt" in str(registry.load_errors[0])
    assert "Plugin 'piw_misspelt'" in capsys.readouterr().err


def test_a_plugin_raising_in_a_hook_is_named_with_the_hook(run_record):
    class Exploding:
        @hookimpl
        def piw_unproductive_turn_limit(self, run, node_id):
            raise ZeroDivisionError("bad maths")

    with plugins.temporary_plugin(Exploding(), name="exploding"):
        with pytest.raises(PluginError) as failure:
            plugins.unproductive_turn_limit(run_record(), "step")

    message = str(failure.value)
    assert message == (
        "Plugin 'exploding' failed in hook piw_unproductive_turn_limit: "
        "ZeroDivisionError: bad maths"
    )
    assert isinstance(failure.value.__cause__, ZeroDivisionError)


def test_a_plugin_failing_in_register_commands_is_skipped(home_env, tmp_path):
    _write_module(
        tmp_path,
        "piw_bad_commands",
        """
        from pi_workflows import hookimpl

        @hookimpl
        def piw_register_commands(cli):
            raise LookupError("no such group")
        """,
    )
    env = {plugins.PLUGINS_ENV: "piw_bad_commands", "PYTHONPATH": str(tmp_path)}

    result = home_env.run_cli("plugins", env=env)

    assert result.returncode == 0
    assert "pi_workflows.builtin.storage" in result.stdout
    assert (
        "Plugin 'piw_bad_commands' failed in hook piw_register_commands: "
        "LookupError: no such group" in result.stderr
    )


def test_notification_failures_are_logged_not_raised(caplog):
    seen = []

    class Listener:
        @hookimpl
        def piw_run_transition(self, run_id, old_status, new_status, detail):
            seen.append((run_id, old_status, new_status, detail))

    class Failing:
        @hookimpl
        def piw_run_transition(self, run_id, old_status, new_status, detail):
            raise OSError("webhook unreachable")

    with (
        plugins.temporary_plugin(Listener(), name="listener"),
        plugins.temporary_plugin(Failing(), name="failing-listener"),
        caplog.at_level(logging.WARNING, logger="pi_workflows.plugins"),
    ):
        plugins.run_transition("run-9", "running", "completed", None, workflow_name="w", at=1)

    assert "Plugin 'failing-listener' failed in hook piw_run_transition" in caplog.text
    assert "OSError: webhook unreachable" in caplog.text
    assert seen == [("run-9", "running", "completed", None)]  # not starved by the failure


def test_reload_picks_up_a_changed_environment(plugin_env, run_record):
    plugin_env.setenv(plugins.DISABLE_ENV, TURNS)
    registry = plugins.reload()
    assert plugins.registry() is registry
    assert not registry.manager.has_plugin(TURNS)
    assert (
        plugins.registry().manager.hook.piw_unproductive_turn_limit(run=run_record(), node_id="x")
        is None
    )
