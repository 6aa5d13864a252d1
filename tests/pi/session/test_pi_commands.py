"""`pi-workflows pi ...`: the extension's path, the set-up checks, what the extension asks."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from piw_pi.node import BUNDLED_PI, DISTRIBUTION_DIR, SESSION_EXTENSION

from pi_workflows.host.lock import live_lock_holder
from tests.host.conftest import HostHarness
from tests.pi.model_server import ScriptedModelServer
from tests.pi.offline_pi import PiHome
from tests.pi.session.workflow_pi import WorkflowPi
from tests.polling import wait_until


def test_extension_path_names_the_entry_file_pi_loads(harness: HostHarness):
    path = Path(harness.cli("pi", "extension-path").stdout.strip())
    assert path.is_absolute() and path.name == "index.ts" and path.is_file()
    assert "export default function" in path.read_text()


def _doctor(harness: HostHarness, env: dict[str, str]) -> tuple[int, dict[str, str]]:
    """`pi doctor`'s exit code and its lines by check name."""
    result = harness.cli("pi", "doctor", check=False, **env)
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    return result.returncode, lines


CHECKS = ["node", "pi", "pi on PATH", "extension", "models", "model", "provider", "host"]

# A person's own extension, listed before pi-workflows is installed.
MINE = """
export default function (pi) {
	pi.registerCommand("mine", { description: "mine", handler: async () => {} });
}
"""


def test_install_makes_plain_pi_load_the_extension_and_uninstall_undoes_only_that(
    pi_session: WorkflowPi,
):
    harness, home = pi_session.harness, pi_session.pi_home
    bin_dir, settings_path = home.root / "bin", home.agent_dir / "settings.json"
    (home.agent_dir / "mine.ts").write_text(MINE)
    before = {**json.loads(settings_path.read_text()), "extensions": ["./mine.ts"]}
    settings_path.write_text(json.dumps(before))
    env = {**home.env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    code, lines = _doctor(harness, env)
    assert code == 1 and list(lines) == CHECKS
    assert lines["pi on PATH"].startswith("none; run 'pi-workflows pi install'")
    assert lines["extension"] == "plain pi does not load it; run 'pi-workflows pi install'"

    installed = harness.cli("pi", "install", "--bin-dir", str(bin_dir), **env)
    assert installed.stdout.splitlines() == [
        f"extension: added to 'extensions' in {settings_path}",
        f"pi: linked {bin_dir / 'pi'} -> {BUNDLED_PI}",
    ]
    after = json.loads(settings_path.read_text())
    assert after == {**before, "extensions": ["./mine.ts", str(SESSION_EXTENSION.resolve())]}

    code, lines = _doctor(harness, env)
    assert code == 0, lines
    assert lines["pi on PATH"] == f"ok ({bin_dir / 'pi'}, the bundled pi)"
    assert lines["extension"] == f"ok (listed in {settings_path})"
    assert lines["model"] == "ok (scripted/scripted-model, Pi's default)"

    # Plain `pi` from PATH, no -e: the extension is loaded and reaches the host.
    pi = pi_session.start(plain=bin_dir / "pi")
    commands = {c["name"] for c in pi.send({"type": "get_commands"})["data"]["commands"]}
    assert {"workflow", "mine"} <= commands
    pi.prompt("/workflow list")
    pi.wait_for(
        lambda e: e.get("method") == "notify" and "two-turn" in e.get("message", ""),
        what="the /workflow list notice",
    )

    uninstalled = harness.cli("pi", "uninstall", **env)
    assert uninstalled.stdout.splitlines() == [
        f"extension: removed from 'extensions' in {settings_path}",
        f"pi: removed the link {bin_dir / 'pi'}",
    ]
    assert json.loads(settings_path.read_text()) == before
    assert not (bin_dir / "pi").exists()
    again = harness.cli("pi", "uninstall", **env)
    assert again.stdout.strip() == "nothing to undo: 'pi-workflows pi install' changed nothing here"


def test_doctor_names_each_missing_piece_of_pis_set_up_with_its_fix(pi_session: WorkflowPi):
    harness, home = pi_session.harness, pi_session.pi_home
    env = home.env

    code, lines = _doctor(harness, {**env, "PI_WORKFLOWS_PI_MODEL": "scripted/nope"})
    assert code == 1
    assert lines["model"] == (
        "Pi does not know the model scripted/nope (PI_WORKFLOWS_PI_MODEL=scripted/nope): "
        "provider scripted has scripted/scripted-model; `pi --list-models` lists the models Pi "
        "can use."
    )

    base_url = pi_session.server.base_url
    pi_session.server.stop()
    code, lines = _doctor(harness, env)
    assert lines["model"].startswith("ok (scripted/scripted-model")
    assert lines["provider"] == (
        f"scripted at {base_url} is unreachable (Connection refused); start "
        f"it, or fix baseUrl in {home.agent_dir / 'models.json'}"
    )

    (home.agent_dir / "models.json").unlink()
    code, lines = _doctor(harness, env)
    assert code == 1
    assert lines["models"].startswith("Pi can use no model (no models.json or auth.json in ")
    assert lines["model"].startswith("pi has no model to use: set PI_WORKFLOWS_PI_MODEL")

    broken = harness.cli("pi", "doctor", check=False, PI_WORKFLOWS_PI_COMMAND="/nonexistent/pi")
    assert broken.returncode == 1
    assert (
        f"pi: /nonexistent/pi does not run; run 'npm ci' in {DISTRIBUTION_DIR} "
        "or set PI_WORKFLOWS_PI_COMMAND"
    ) in broken.stdout.splitlines()
    assert f"host: ok (running for {harness.home.root})" in broken.stdout.splitlines()

    unsplittable = harness.cli("pi", "doctor", check=False, PI_WORKFLOWS_PI_ARGS='"unclosed')
    assert unsplittable.returncode == 1 and "Traceback" not in unsplittable.stderr
    assert (
        "pi: not checked (The pi_args setting cannot be split like a shell command "
        "(No closing quotation); fix its quotes with 'pi-workflows config set' or its "
        "PI_WORKFLOWS_ variable.)"
    ) in unsplittable.stdout.splitlines()


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


def test_a_host_the_extension_starts_does_not_inherit_what_pi_sets_for_itself(
    harness: HostHarness, pi_home: PiHome, model_server: ScriptedModelServer
):
    """Pi sets PI_CODING_AGENT=true in its own process; a host started through the
    extension is nobody's child and must not pass it to its workers and their commands."""
    harness.write_workflow("environment", ENVIRONMENT)
    bed = WorkflowPi(harness, pi_home, model_server)
    try:
        bed.start(f"pi-session-{uuid.uuid4().hex}")  # connecting starts the home's host
        wait_until(
            lambda: harness.home.host_dir.exists() and live_lock_holder(harness.home.lock_path),
            timeout=60,
            what="the host the extension starts",
        )
        # What a worker of that host is given (a forked host's /proc environ is its
        # forebear's, so the worker reports its own).
        run_id = json.loads(harness.cli("run", "start", "environment", "--json").stdout)["runId"]
        harness.wait_for_status(run_id, "completed")
        env = json.loads((harness.project / "environment.json").read_text())
        assert env["PI_WORKFLOWS_HOME"] == str(harness.home.root)
        assert "PI_CODING_AGENT" not in env
    finally:
        bed.close()


ENVIRONMENT = """
import json
import os
from pathlib import Path

from pi_workflows import compute, workflow


def report(ctx):
    (Path.cwd() / "environment.json").write_text(json.dumps(dict(os.environ)))
    return {}


WORKFLOW = workflow(
    name="environment", start_at="report", nodes={"report": compute(report)}, edges=[]
)
"""
