"""Settings that stick: `<config>/settings.toml`, `pi-workflows config`, and a host that
takes the file's settings whichever process started it, with the environment overriding.

Real processes throughout: the CLI as a subprocess, hosts it starts on demand, workers that
run a headless agent step with the command the file names.
"""

from __future__ import annotations

import json
import stat
import sys
import tomllib

import pytest

from pi_workflows import settings
from pi_workflows.testing import WorkflowHome
from tests.conftest import REPO_ROOT

# An agent command that answers every step prompt; its reply names where it came from.
AGENT = f'{sys.executable} -c "print(\'{{\\"reply\\": \\"from the file\\"}}\')"'

LEASE_AND_TIMER_VARIABLES = [
    item.env for item in settings.SETTINGS if item.key.endswith(("_ms", "_s"))
] + ["PI_WORKFLOWS_MAX_WORKERS", "PI_WORKFLOWS_CLAIM_WINDOW"]


def cli(home: WorkflowHome, *args: str, **env: str):
    return home.run_cli(*args, env=env)


def status_settings(home: WorkflowHome) -> dict[str, dict]:
    result = cli(home, "host", "status", "--json")
    assert result.returncode == 0, result.stderr
    return {item["key"]: item for item in json.loads(result.stdout)["settings"]}


def test_config_set_get_unset_and_list_keep_a_private_toml_file(workflow_home):
    assert cli(workflow_home, "config", "set", "run_lease_ms", "12000").returncode == 0
    assert cli(workflow_home, "config", "set", "pi_model", "local/qwen").returncode == 0

    path = workflow_home.config_dir / "settings.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert tomllib.loads(path.read_text()) == {"pi_model": "local/qwen", "run_lease_ms": 12000}
    assert cli(workflow_home, "config", "get", "run_lease_ms").stdout == "12000\n"
    listed = json.loads(cli(workflow_home, "config", "list", "--json").stdout)
    by_key = {entry["key"]: entry for entry in listed["settings"]}
    assert by_key["run_lease_ms"]["source"] == "file"
    assert by_key["max_workers"] == {**by_key["max_workers"], "value": 4, "source": "default"}
    # The environment overrides the file, and `config` says where a value comes from.
    overridden = cli(
        workflow_home,
        "config",
        "get",
        "run_lease_ms",
        "--json",
        **{"PI_WORKFLOWS_RUN_LEASE_MS": "9000"},
    )
    assert json.loads(overridden.stdout)["value"] == 9000
    assert json.loads(overridden.stdout)["source"] == "env"

    assert cli(workflow_home, "config", "unset", "run_lease_ms").returncode == 0
    assert tomllib.loads(path.read_text()) == {"pi_model": "local/qwen"}
    assert cli(workflow_home, "config", "get", "run_lease_ms").stdout == "30000\n"


@pytest.mark.parametrize(
    ("key", "value"),
    [("run_lease_ms", "0"), ("host_lease_ms", "-5"), ("poll_s", "soon"), ("max_workers", "1.5")],
)
def test_config_set_refuses_a_bad_value_with_one_line_and_writes_nothing(workflow_home, key, value):
    cli(workflow_home, "config", "set", "max_workers", "2")
    before = (workflow_home.config_dir / "settings.toml").read_text()

    result = cli(workflow_home, "config", "set", key, value)

    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"Error: {key} must be a positive ")
    assert line.endswith(f", got {value!r}.")
    assert (workflow_home.config_dir / "settings.toml").read_text() == before


def test_an_unshipped_terminal_language_is_refused_naming_the_shipped_ones(workflow_home):
    result = cli(workflow_home, "config", "set", "terminal_language", "klingon")

    assert result.returncode == 1
    assert result.stderr == (
        "Error: terminal_language must be one of de, en, es, fr, got 'klingon'.\n"
    )
    assert cli(workflow_home, "config", "set", "terminal_language", "FR").returncode == 0
    assert cli(workflow_home, "config", "get", "terminal_language").stdout == "fr\n"


def test_an_unknown_key_is_refused_naming_the_known_ones(workflow_home):
    result = cli(workflow_home, "config", "set", "max_workerz", "3")
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert "No setting named 'max_workerz'" in line and "max_workers" in line


@pytest.mark.scenario("2.15")
@pytest.mark.parametrize("variable", LEASE_AND_TIMER_VARIABLES)
@pytest.mark.parametrize("raw", ["0", "-1", "later"])
def test_lease_and_timer_variables_refuse_zero_negative_and_text(tmp_path, variable, raw):
    # Every reader (host, worker, client) resolves settings through this one registry.
    with pytest.raises(settings.SettingError) as refused:
        settings.resolve(env={variable: raw}, directory=tmp_path)
    message = str(refused.value)
    assert message.startswith(f"{variable} must be a positive ")
    assert message.endswith(f", got {raw!r}.") and "\n" not in message


@pytest.mark.scenario("2.15")
def test_a_command_refuses_a_bad_lease_before_it_starts_a_host(workflow_home):
    result = cli(workflow_home, "run", "list", PI_WORKFLOWS_RUN_LEASE_MS="0")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "Error: PI_WORKFLOWS_RUN_LEASE_MS must be a positive integer, got '0'."
    ]
    assert not workflow_home.home.socket_path.exists()


@pytest.mark.parametrize(
    "content", [b"max_workers = \n", b"terminal_language = '\xff'\n"], ids=["toml", "utf8"]
)
def test_a_settings_file_that_is_not_toml_is_refused_with_one_line(workflow_home, content):
    path = workflow_home.config_dir / "settings.toml"
    path.write_bytes(content)
    result = cli(workflow_home, "config", "list")
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"Error: {path} is not valid TOML (")
    assert line.endswith("); fix or remove it.")


@pytest.mark.scenario("2.15")
def test_a_host_refuses_a_zero_lease_from_the_file_with_one_line(workflow_home):
    (workflow_home.config_dir / "settings.toml").write_text("host_lease_ms = 0\n")
    result = cli(workflow_home, "host", "run")
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line == (
        f"Error: host_lease_ms in {workflow_home.config_dir / 'settings.toml'} must be a "
        "positive integer, got 0."
    )


def test_a_host_started_by_any_command_runs_with_the_settings_file(workflow_home):
    cli(workflow_home, "config", "set", "agent_command", AGENT)
    # The host starts on demand from a command whose environment knows nothing of it.
    started = cli(workflow_home, "run", "start", "echo", "--headless", "--wait")
    assert started.returncode == 0, started.stderr
    assert '"reply": "from the file"' in started.stdout
    shown = status_settings(workflow_home)
    assert shown["agent_command"] == {**shown["agent_command"], "source": "file"}
    assert shown["agent_command"]["value"] == "(set)"  # a command line may carry a secret
    assert shown["agent_executor"]["source"] == "default"


def test_host_status_never_shows_a_secret_setting(workflow_home):
    cli(workflow_home, "config", "set", "pi_args", "--api-key s3cret-token")
    cli(workflow_home, "host", "start")
    text = cli(workflow_home, "host", "status")
    assert "pi_args = (set)  [file]" in text.stdout
    assert "s3cret" not in text.stdout + cli(workflow_home, "host", "status", "--json").stdout


def test_a_client_asking_for_other_settings_is_told_how_to_apply_them(workflow_home):
    cli(workflow_home, "config", "set", "max_workers", "3")
    assert cli(workflow_home, "host", "start").returncode == 0
    assert status_settings(workflow_home)["max_workers"]["value"] == 3

    asked = cli(workflow_home, "run", "list", PI_WORKFLOWS_MAX_WORKERS="2")
    [warning] = asked.stderr.strip().splitlines()
    assert "max_workers (PI_WORKFLOWS_MAX_WORKERS)" in warning
    assert "pi-workflows host restart" in warning
    # The same environment with the host's value, and a command that asks nothing: silent.
    assert cli(workflow_home, "run", "list", PI_WORKFLOWS_MAX_WORKERS="3").stderr == ""
    assert cli(workflow_home, "run", "list").stderr == ""

    restarted = cli(workflow_home, "host", "restart", PI_WORKFLOWS_MAX_WORKERS="2")
    assert restarted.returncode == 0 and restarted.stderr == "", restarted.stderr
    shown = status_settings(workflow_home)["max_workers"]
    assert (shown["value"], shown["source"]) == (2, "env")
    assert cli(workflow_home, "run", "list", PI_WORKFLOWS_MAX_WORKERS="2").stderr == ""


def test_a_command_that_changes_a_host_level_setting_says_the_host_keeps_its_own(workflow_home):
    cli(workflow_home, "host", "start")
    changed = cli(workflow_home, "config", "set", "pi_model", "local/qwen")
    assert "pi-workflows host restart" in changed.stdout


def test_every_setting_is_documented_in_the_operations_guide():
    guide = (REPO_ROOT / "docs" / "operations.md").read_text()
    for item in settings.SETTINGS:
        assert f"| `{item.key}` | `{item.env}` |" in guide, item.key
