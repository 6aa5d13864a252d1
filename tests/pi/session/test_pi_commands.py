"""`pi-workflows pi ...`: the extension's path, the set-up checks, what the extension asks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from piw_pi.node import DISTRIBUTION_DIR

from tests.host.conftest import HostHarness


def test_extension_path_names_the_entry_file_pi_loads(harness: HostHarness):
    path = Path(harness.cli("pi", "extension-path").stdout.strip())
    assert path.is_absolute() and path.name == "index.ts" and path.is_file()
    assert "export default function" in path.read_text()


def test_doctor_checks_node_pi_the_extension_and_the_host_one_line_each(harness: HostHarness):
    result = harness.cli("pi", "doctor")
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["node", "pi", "extension", "host"]
    assert lines[1].startswith("pi: ok (0.73.1 at ")
    assert "not running" in lines[3]

    harness.start_host()
    broken = harness.cli("pi", "doctor", check=False, PI_WORKFLOWS_PI_COMMAND="/nonexistent/pi")
    assert broken.returncode == 1
    lines = broken.stdout.splitlines()
    assert lines[1] == (
        f"pi: /nonexistent/pi does not run; run 'npm ci' in {DISTRIBUTION_DIR} "
        "or set PI_WORKFLOWS_PI_COMMAND"
    )
    assert lines[3].startswith("host: ok (running for ")


@pytest.mark.scenario("4.18")
def test_socket_starts_a_host_unless_told_not_to(harness: HostHarness):
    refused = harness.cli("--no-autostart", "pi", "socket", check=False)
    assert refused.returncode == 1
    assert "No workflow host is running" in refused.stderr
    found = json.loads(harness.cli("pi", "socket", "--json").stdout)
    assert found["socketPath"] == str(harness.home.socket_path)
    assert harness._answers()


def test_start_payload_is_what_run_start_needs_and_bad_input_is_one_line(harness: HostHarness):
    payload = json.loads(
        harness.cli("pi", "start-payload", "two-turn", "--input-json", '{"goal": "x"}').stdout
    )
    assert payload["workflowName"] == "two-turn" and payload["input"] == {"goal": "x"}
    assert payload["projectPath"] == str(harness.project.resolve())
    bad = harness.cli("pi", "start-payload", "two-turn", "--input-json", "{nope", check=False)
    assert bad.returncode == 1
    assert bad.stderr.strip().count("\n") == 0 and "not valid JSON" in bad.stderr
