"""The worker fork server: imports once, then forks one worker process per launch.

A cold Python worker spends almost all of its startup importing modules; a fork of a
process that already imported them starts in milliseconds. The host sends a launch
(envelope, working directory) with the worker's three pipe ends attached (SCM_RIGHTS)
over a Unix SOCK_SEQPACKET socket (one launch per packet) whose fd number is in
`PI_WORKFLOWS_ZYGOTE_FD`; the zygote forks, the child becomes the leader of its own
process group and runs the ordinary worker entry, and the zygote reports the child's
pid and, later, its exit code. The zygote stays single-threaded so forking is safe.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys

CONTROL_FD_ENV = "PI_WORKFLOWS_ZYGOTE_FD"
MAX_CONTROL_BYTES = 1024 * 1024 + 4096


def _preload() -> None:
    from .. import discovery, engine  # noqa: F401  (imported for the children)
    from . import main  # noqa: F401

    discovery.registered_workflows()


def _send(control: socket.socket, message: dict) -> None:
    control.send(json.dumps(message).encode("utf-8"))


def _run_child(control: socket.socket, wakeup_r: int, launch: dict, fds: list[int]) -> None:
    """In the forked child: become a plain worker and never return."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        control.close()
        os.close(wakeup_r)
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ["PI_WORKFLOWS_WORKER_LAUNCH"] = launch["envelope"]
        os.chdir(launch["cwd"])
        from .main import main

        code = main([])
    except SystemExit as exit_request:
        code = exit_request.code if isinstance(exit_request.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> int:
    control = socket.socket(fileno=int(os.environ.pop(CONTROL_FD_ENV)))
    _preload()
    wakeup_r, wakeup_w = os.pipe()
    os.set_blocking(wakeup_w, False)
    signal.set_wakeup_fd(wakeup_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ, "control")
    selector.register(wakeup_r, selectors.EVENT_READ, "child")
    _send(control, {"ready": True})
    while True:
        for key, _ in selector.select():
            if key.data == "child":
                os.read(wakeup_r, 4096)
                _reap(control)
                continue
            data, fds, _flags, _addr = socket.recv_fds(control, MAX_CONTROL_BYTES, 3)
            if not data:
                return 0  # the host went away; its workers are its business
            launch = json.loads(data)
            pid = os.fork()
            if pid == 0:
                _run_child(control, wakeup_r, launch, fds)
            for fd in fds:
                os.close(fd)
            _send(control, {"launchId": launch["launchId"], "pid": pid})


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(control, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})
