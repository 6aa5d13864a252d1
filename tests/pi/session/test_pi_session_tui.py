"""The interactive path as a person sees it: the real Pi TUI in tmux, typed into, read back."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from piw_pi.node import SESSION_EXTENSION

from tests.pi.model_server import Text
from tests.pi.offline_pi import pi_executable
from tests.pi.session.workflow_pi import WorkflowPi, submit, two_turn_script
from tests.polling import wait_until
from tests.tmux import Tmux


def test_a_person_starts_two_turn_in_the_pi_tui_and_watches_it_finish(
    pi_session: WorkflowPi, tmux: Tmux
):
    pi_session.server.script(*two_turn_script())
    env = {**pi_session.pi_home.env, **pi_session.env(), "TERM": "xterm-256color"}
    argv = [str(pi_executable()), "--no-session", "--model", pi_session.pi_home.model]
    argv += ["-e", str(SESSION_EXTENSION)]
    command = "env -i " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    tmux.start(f"{command} {shlex.join(argv)}", str(pi_session.pi_home.project))
    wait_until(lambda: "pi v0.73.1" in tmux.screen(), what="the Pi TUI")

    tmux.type("/workflow start two-turn")
    card = wait_until(
        lambda: "▶ two-turn › inspect" in (screen := tmux.screen()) and screen,
        timeout=60,
        what="the step card",
    )
    # The card's second line is the node's status detail.
    lines = card.splitlines()
    title = next(i for i, line in enumerate(lines) if "▶ two-turn › inspect" in line)
    assert lines[title + 1].strip() == "reading the project", card
    run = pi_session.wait_for_run("completed", "failed", "cancelled", timeout=90)
    assert run["status"] == "completed", run
    final = wait_until(
        lambda: "The two-turn workflow completed" in (screen := tmux.screen()) and screen,
        timeout=60,
        what="the model's explanation of the result",
    )
    # The terminal message itself is hidden: its quoted result is not on the screen.
    assert "Workflow result:" not in final
    assert "Continue in this session." not in final


def test_the_documented_set_up_gets_a_person_from_install_to_a_finished_workflow_in_pi(
    pi_session: WorkflowPi, tmux: Tmux
):
    """docs/pi.md's Install, as written: `pi-workflows pi install`, `pi-workflows pi doctor`,
    plain `pi` (found on PATH, loading the extension from Pi's settings, finding the CLI on
    PATH), then `/workflow echo Say hello in French`."""
    home, harness = pi_session.pi_home, pi_session.harness
    venv_bin = Path(sys.executable).parent
    bin_dir = home.root / "bin"
    path = os.pathsep.join([str(bin_dir), str(venv_bin), "/usr/bin", "/bin"])
    env = {**home.env, **pi_session.env(), "PATH": path, "TERM": "xterm-256color"}
    del env["PI_WORKFLOWS_CLI"]  # the extension runs `pi-workflows` from PATH
    harness.cli("pi", "install", "--bin-dir", str(bin_dir), **env)
    doctor = harness.cli("pi", "doctor", **env)  # exits 1 on any failing line
    assert all(": ok (" in line for line in doctor.stdout.splitlines()), doctor.stdout

    pi_session.server.script(
        submit("reply", {"reply": "Bonjour !"}),
        Text("Replied."),
        Text("The echo workflow answered: Bonjour !"),
    )
    command = "env -i " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    tmux.start(f"{command} pi --no-session", str(home.project))
    wait_until(lambda: "pi v0.73.1" in tmux.screen(), what="the Pi TUI")
    tmux.type("/workflow echo Say hello in French")
    wait_until(lambda: "▶ echo › reply" in tmux.screen(), timeout=60, what="the step card")
    run = pi_session.wait_for_run("completed", "failed", "cancelled", timeout=90)
    assert (run["status"], run["finalOutput"]) == ("completed", {"reply": "Bonjour !"}), run
    wait_until(
        lambda: "The echo workflow answered: Bonjour !" in tmux.screen(),
        timeout=60,
        what="the model's explanation of the result",
    )
