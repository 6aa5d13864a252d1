"""The worker fork server: imports once, then forks one worker process per launch.

A cold Python worker spends almost all of its startup importing modules; a fork of a
process that already imported them starts in milliseconds. The host sends a launch
(envelope, working directory) with the worker's three pipe ends attached (SCM_RIGHTS)
over a Unix SOCK_SEQPACKET socket (one launch per packet) whose fd number is in
`PI_WORKFLOWS_ZYGOTE_FD`; the zygote reports the worker's pid and, later, its exit
code. The zygote stays single-threaded so forking is safe.

The fork itself is kept off the launch: the zygote keeps one **spare** child, forked
ahead and already the leader of its own process group, blocked on a private socket. A
launch is handed to the spare as it came (packet and pipe ends), and the next spare is
forked after the reply. When there is no live spare the zygote forks for the launch.
A spare whose zygote dies reads end-of-file and exits.

`pi-workflows host run` forks its fork server-to-be first thing, before the host imports
its own modules, while it has one thread and no database connection or socket
(`fork_standby`). The child imports what workers need at once, beside the host's own
start-up, and waits for the host's first launch to serve. It never held the host's
modules, so it maps about half the memory a fork of the started host would (14 MB of
private pages against 25): every fork copies, and every worker's exit tears down, that
many fewer page-table entries, about 2 ms less CPU per run (docs/performance.md). A
host that cannot fork then (one in a process with other threads) is given a standby
forked elsewhere (the test kit's launcher forks one for its in-process hosts) or starts
the fork server as a new interpreter (`python -m pi_workflows.worker --zygote`), the
title the standby takes too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, NoReturn

from .. import forked_child
from ..fork_loop import CHILD, ForkLoop
from .command import worker_argv, worker_pythonpath

CONTROL_FD_ENV = "PI_WORKFLOWS_ZYGOTE_FD"
MAX_CONTROL_BYTES = 1024 * 1024 + 4096
# The host's first launch sends this to its standby, which then serves.
SERVE = b"serve"
# How long a fork server whose host went away waits for its unused spare to exit.
SPARE_EXIT_S = 1.0


def _preload() -> None:
    from .. import discovery, engine  # noqa: F401  (imported for the children)
    from . import main  # noqa: F401

    discovery.registered_workflows()


def _send(control: socket.socket, message: dict) -> None:
    control.send(json.dumps(message).encode("utf-8"))


class Spare:
    """A forked child waiting for its launch on its own socket."""

    def __init__(self, pid: int, channel: socket.socket) -> None:
        self.pid = pid
        self.channel = channel

    def hand_over(self, data: bytes, fds: list[int]) -> bool:
        """Give the spare this launch; False when it is gone (the zygote forks instead)."""
        try:
            socket.send_fds(self.channel, [data], fds)
        except OSError:
            return False
        finally:
            self.channel.close()
        return True


def _fork_child(body: Callable[[socket.socket], object]) -> tuple[int, socket.socket]:
    """Fork a child that runs `body` (which never returns) on its end of a new socket
    pair; returns the child's pid and this process's end."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        ours.close()
        body(theirs)
    theirs.close()
    return pid, ours


def _fork_spare(loop: ForkLoop) -> Spare:
    """Fork a spare that runs the launch it is handed."""
    return Spare(*_fork_child(lambda launches: _become_worker(loop, launches)))


def _become_worker(loop: ForkLoop, launches: socket.socket | tuple[bytes, list[int]]) -> None:
    """In the forked child: leave the zygote's state, take the launch (a spare waits for
    it on its socket), run it, exit."""

    def run() -> int:
        loop.leave()
        os.setsid()
        if isinstance(launches, socket.socket):
            from .host_pipe import start_reader_ahead

            start_reader_ahead()  # a spare: its launch then need not wait for the thread
            data, fds, _flags, _addr = socket.recv_fds(launches, MAX_CONTROL_BYTES, 3)
            launches.close()
            if not data:
                return 0  # the zygote is gone: this spare was never used
        else:
            data, fds = launches
        launch = json.loads(data)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.update(launch.get("env", {}))  # the launch's own (its limits, say)
        os.environ["PI_WORKFLOWS_WORKER_LAUNCH"] = launch["envelope"]
        os.chdir(launch["cwd"])
        from .main import main

        return main([])

    _exit_after(run)


def _exit_after(body: Callable[[], int]) -> NoReturn:
    """Run `body` in a forked child and end the child with its status, flushed, without
    running the parent's exit handlers (`os._exit`)."""
    code = 1
    try:
        code = body()
    except SystemExit as exit_request:
        code = exit_request.code if isinstance(exit_request.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class ForkedStandby(NamedTuple):
    pid: int
    control: socket.socket  # the host's end


def fork_standby(cwd: str) -> ForkedStandby | None:
    """Fork the fork server-to-be now (`standby`); None when this process has other
    threads (a fork would copy their locks held) or the system has no pidfds for the
    host to watch the child with."""
    if threading.active_count() != 1 or not hasattr(os, "pidfd_open"):
        return None
    return ForkedStandby(*_fork_child(lambda control: standby(control, cwd)))


def standby(control: socket.socket, cwd: str) -> NoReturn:
    """In the child a starting host forked: leave the host behind, import what workers
    need, wait for the host's first launch, then serve; exit at once if the host goes
    away (or stops) before that."""

    def run() -> int:
        _leave_host(control, cwd)
        _preload()  # now, while the host starts: its first launch need not wait for it
        if control.recv(len(SERVE)) != SERVE:
            return 0
        os.chdir(cwd)  # the host made it by now (it may not have existed at the fork)
        return serve(control, preloaded=True)

    _exit_after(run)


def _leave_host(control: socket.socket, cwd: str) -> None:
    """Become what `python -m pi_workflows.worker --zygote` started in `cwd` would be
    (but for the working directory, which `standby` enters when it is to serve):
    its own session, stdin and stdout on /dev/null, no descriptor of the host's but
    stderr, no log handler, default signals, the worker's import path."""
    for handler in logging.root.handlers[:]:
        handler.close()
        logging.root.removeHandler(handler)
    devnull = os.open(os.devnull, os.O_RDWR)
    forked_child.detach((devnull, devnull, 2), keep=[control.fileno()])
    # An interpreter run with `-m` in `cwd` puts `cwd` first, then PYTHONPATH's entries.
    os.environ["PYTHONPATH"] = worker_pythonpath()
    wanted = [cwd, *os.environ["PYTHONPATH"].split(os.pathsep), *sys.path[1:]]
    sys.path[:] = list(dict.fromkeys(wanted))
    sys.argv[:] = [str(Path(__file__).with_name("__main__.py")), "--zygote"]
    import setproctitle

    # `ps` and the tests tell the fork server from its host by this.
    setproctitle.setproctitle(" ".join([*worker_argv(), "--zygote"]))


def serve(control: socket.socket | None = None, *, preloaded: bool = False) -> int:
    """Serve launches on `control` (by default the socket whose fd is in the environment)."""
    if control is None:
        control = socket.socket(fileno=int(os.environ.pop(CONTROL_FD_ENV)))
    if not preloaded:
        _preload()
    loop = ForkLoop(control)
    first_spare = _fork_spare(loop)
    spare: Spare | None = first_spare
    unannounced = {first_spare.pid}  # children the host never heard of: their exits are not news
    _send(control, {"ready": True})
    while True:
        for event in loop.events():
            if event == CHILD:
                gone = _reap(control, unannounced)
                unannounced -= gone
                if spare is not None and spare.pid in gone:
                    spare.channel.close()
                    spare = None  # it died unused; the next launch forks
                continue
            data, fds, _flags, _addr = socket.recv_fds(control, MAX_CONTROL_BYTES, 3)
            if not data:
                # The host went away or stops: its workers are its business, the spare
                # is ours. It ends before we do, so that a host that waits for its fork
                # server leaves no process of its own behind.
                if spare is not None:
                    _end_spare(spare)
                return 0
            launch = json.loads(data)
            if spare is not None and spare.hand_over(data, fds):
                pid = spare.pid
                unannounced.discard(pid)
            else:
                pid = os.fork()
                if pid == 0:
                    _become_worker(loop, (data, fds))
            for fd in fds:
                os.close(fd)
            _send(control, {"launchId": launch["launchId"], "pid": pid})
            _precompile_workflow(launch["envelope"])
            spare = _fork_spare(loop)
            unannounced.add(spare.pid)


def _end_spare(spare: Spare) -> None:
    """Close the spare's socket (it reads end-of-file and exits) and reap it; one that
    does not exit within `SPARE_EXIT_S` (stopped, say) is killed."""
    spare.channel.close()
    with contextlib.suppress(ChildProcessError, ProcessLookupError):
        exited = os.pidfd_open(spare.pid)
        try:
            if not select.select([exited], [], [], SPARE_EXIT_S)[0]:
                os.kill(spare.pid, signal.SIGKILL)
        finally:
            os.close(exited)
        os.waitpid(spare.pid, 0)


def _precompile_workflow(envelope: str) -> None:
    """The next spare inherits this launch's workflow file compiled (a run's continuation
    and the next run of the same workflow load it again)."""
    from ..discovery.loader import precompile

    source = json.loads(envelope).get("workflowSource") or {}
    if source.get("kind") == "file" and isinstance(source.get("path"), str):
        precompile(Path(source["path"]))


def _reap(control: socket.socket, unannounced: set[int]) -> set[int]:
    """Report every exited worker but the `unannounced` ones; returns those that exited."""
    gone: set[int] = set()
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return gone
        if pid == 0:
            return gone
        if pid in unannounced:
            gone.add(pid)
        else:
            _send(control, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})
