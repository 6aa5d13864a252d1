"""A host a command starts on demand (SPEC §5): forked from the command, it is what
`python -m pi_workflows host run` started in the background would be."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import psutil
import pytest

from pi_workflows.host.lock import live_lock_holder
from pi_workflows.testing import WorkflowHome, launcher, wait_until


@pytest.mark.parametrize(
    ("title_env", "forked"),
    [
        ({}, True),
        # setproctitle may then use only the command's own argument space, too short for
        # the host's title: the child starts the host anew rather than show a cut title
        # (or the command's arguments).
        ({"SPT_NOENV": "1"}, False),
    ],
    ids=["forked", "not retitled"],
)
def test_a_host_a_command_starts_keeps_none_of_its_output_or_descriptors(
    workflow_home: WorkflowHome, title_env: dict[str, str], forked: bool
):
    home = workflow_home
    # A real command process whose output is pipes, given one more pipe's writing end: a
    # host that kept any descriptor of the command's would keep that pipe open.
    reading, writing = os.pipe()
    try:
        started = subprocess.run(
            [str(launcher.console_script()), "run", "start", "hello", "--wait"],
            env={**home.env, **title_env},
            cwd=home.project,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            pass_fds=[writing],
        )
        os.close(writing)
        assert started.returncode == 0, started.stderr
        assert "Hello, world!" in started.stdout
        os.set_blocking(reading, False)
        # End of file: nobody (the host included) holds the writing end any more.
        assert wait_until(lambda: _at_end(reading), what="the pipe's end of file") is True
    finally:
        os.close(reading)
    holder = live_lock_holder(home.home.lock_path)
    assert holder is not None
    host = psutil.Process(holder["pid"])

    log = home.home.logs_dir / "host.log"
    argv = [sys.executable, "-m", "pi_workflows", "--home", str(home.home.root)]
    argv += ["host", "run", "--log-file", str(log)]
    assert " ".join(host.cmdline()) == " ".join(argv)  # what `ps` shows
    assert _was_forked(host.pid) is forked
    assert os.getsid(host.pid) == host.pid  # its own session: not the command's terminal's
    assert host.cwd() == str(home.project)

    def targets() -> dict[int, str]:
        """The host's open descriptors; one it closes while they are read is left out
        (the run's worker may still be ending)."""
        found = {}
        for fd in os.listdir(f"/proc/{host.pid}/fd"):
            with contextlib.suppress(FileNotFoundError):
                found[int(fd)] = os.readlink(f"/proc/{host.pid}/fd/{fd}")
        return found

    stdio = targets()
    assert stdio[0] == os.devnull
    assert stdio[1] == stdio[2] == str(log)
    # The run's worker may still be ending, its pipes still open in the host (the
    # command's own pipes reached their end of file above and in `subprocess.run`).
    wait_until(
        lambda: not [target for target in targets().values() if target.startswith("pipe:")],
        what="the host to hold no pipe once its run's worker is gone",
    )
    wait_until(lambda: "ready at epoch" in log.read_text(), what="the host's start in its log")

    stopped = home.run_cli("host", "stop")
    assert stopped.returncode == 0 and "host stopped" in stopped.stdout
    assert live_lock_holder(home.home.lock_path) is None


def _at_end(fd: int) -> bool:
    try:
        return os.read(fd, 1) == b""
    except BlockingIOError:
        return False  # a writer still holds it


def _was_forked(pid: int) -> bool:
    """A forked host's command line is its title, one string; an exec'd one's is its
    arguments, one string each."""
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        first = cmdline.read().split(b"\0", 1)[0].decode()
    return " " in first


# A program that embeds the client and has a second thread (the guard, `_may_fork`), and
# one whose command line entry is set but runs an event loop: both start a new interpreter.
EMBEDDED = """
import asyncio, sys, threading
from pi_workflows import forked_child
from pi_workflows.cli.main import main
from pi_workflows.client.autostart import start_background_host
from pi_workflows.home import resolve_home

forked_child.command_entry = main
home = resolve_home(None)
if sys.argv[1] == "thread":
    stop = threading.Event()
    threading.Thread(target=stop.wait).start()
    print(start_background_host(home, None))
    stop.set()
else:
    async def start():
        return start_background_host(home, None)
    print(asyncio.run(start()))
"""


@pytest.mark.parametrize("why", ["thread", "event loop"])
def test_a_process_that_cannot_fork_safely_starts_the_host_as_a_new_interpreter(
    workflow_home: WorkflowHome, why: str
):
    home = workflow_home
    started = subprocess.run(
        [sys.executable, "-c", EMBEDDED, why.split()[0]],
        env=home.env,
        cwd=home.project,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 0, started.stderr
    pid = int(started.stdout.strip())
    assert psutil.Process(pid).cmdline()[1:4] == ["-m", "pi_workflows", "--home"]
    assert _was_forked(pid) is False
    assert home.run_cli("host", "stop").returncode == 0
