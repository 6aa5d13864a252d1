"""Forked children that stand for a new process: how they leave their parent, and end.

A starting host forks its worker fork server-to-be (`worker/zygote.py`), a command forks
the host it starts on demand (`client/autostart.py`), and the test kit's launcher forks
each command it runs. `detach` makes such a child a process of its own, as a new one
started in the background would be. A command's child (`exit_as_interpreter`) then ends as
`python` would end it: `SystemExit`'s status (its message printed), a traceback and 1 for
any other exception, non-daemon threads joined, `atexit` handlers run, streams flushed.
It skips one thing: tearing every module and object down, which would touch, and so copy,
each page the child shares with its parent (it cost a forked command three times its
work), so it leaves with `os._exit`.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable, Collection
from typing import NoReturn

# How to run `pi-workflows ARGS` in this very process: set by the command line as it
# starts (`cli.main.main`), so that a host a command starts on demand is forked from it
# (`client/autostart.py`). A program that embeds the client leaves it unset, and its
# hosts are new interpreters.
command_entry: Callable[[list[str]], object] | None = None


def detach(stdio: tuple[int, int, int], keep: Collection[int] = ()) -> None:
    """Become a process of its own: a new session, `stdio` as descriptors 0, 1 and 2, no
    other descriptor of the parent's but `keep`, and default signal handling."""
    os.setsid()
    for target, fd in enumerate(stdio):
        if fd != target:
            os.dup2(fd, target)
    low = 3
    for fd in sorted(fd for fd in keep if fd >= low):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)


def exit_as_interpreter(body: Callable[[], object]) -> NoReturn:
    """Run `body` and end this (forked) process as the interpreter would."""
    code = 0
    try:
        body()
    except SystemExit as exit_request:
        code = exit_status(exit_request)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def exit_status(exit_request: SystemExit) -> int:
    """The exit status Python gives `exit_request` at the top level."""
    if exit_request.code is None:
        return 0
    if isinstance(exit_request.code, int):
        return exit_request.code
    print(exit_request.code, file=sys.stderr)
    return 1
