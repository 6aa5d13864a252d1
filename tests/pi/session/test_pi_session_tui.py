"""The interactive path as a person sees it: the real Pi TUI in tmux, typed into, read back."""

from __future__ import annotations

import shlex
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from piw_pi.node import SESSION_EXTENSION

from tests.pi.offline_pi import pi_executable
from tests.pi.session.workflow_pi import WorkflowPi, two_turn_script
from tests.polling import wait_until


class Tmux:
    """One detached tmux session on a private tmux server."""

    def __init__(self) -> None:
        self.server = f"piw-test-{uuid.uuid4().hex[:8]}"

    def run(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.server, *args], capture_output=True, text=True, check=True
        )
        return done.stdout

    def start(self, command: str, cwd: str) -> None:
        self.run("new-session", "-d", "-s", "pi", "-x", "140", "-y", "50", "-c", cwd, command)

    def type(self, text: str) -> None:
        self.run("send-keys", "-t", "pi", "-l", text)
        self.run("send-keys", "-t", "pi", "Enter")

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "pi")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.server, "kill-server"], capture_output=True)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    terminal = Tmux()
    try:
        yield terminal
    finally:
        terminal.close()


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
