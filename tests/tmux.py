"""A real terminal for tests: a detached tmux session on a private tmux server, typed
into and read back (the Pi TUI's tests, the viewer's)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest


class Tmux:
    """One detached tmux session on a private tmux server."""

    def __init__(self) -> None:
        self.server = f"piw-test-{uuid.uuid4().hex[:8]}"

    def run(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.server, *args], capture_output=True, text=True, check=True
        )
        return done.stdout

    def start(self, command: str, cwd: str, size: tuple[int, int] = (140, 50)) -> None:
        width, height = size
        self.run(
            "new-session", "-d", "-s", "pi", "-x", str(width), "-y", str(height), "-c", cwd, command
        )

    def type(self, text: str) -> None:
        self.run("send-keys", "-t", "pi", "-l", text)
        self.run("send-keys", "-t", "pi", "Enter")

    def keys(self, *keys: str) -> None:
        """Keys by tmux's names (`Left`, `Enter`, `a`)."""
        self.run("send-keys", "-t", "pi", *keys)

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
