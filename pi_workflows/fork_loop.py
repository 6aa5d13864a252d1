"""The loop of a single-threaded fork server: requests on one control socket, and the
exits of the children it forked.

The worker fork server (`worker/zygote.py`) and the test kit's launcher
(`testing/launcher.py`) each wait for requests on a control socket and fork a child for
each. A child's exit is noticed through SIGCHLD, whose handler only writes to a wake-up
pipe (`signal.set_wakeup_fd`), so one `select` sees both kinds of event, and the server
never runs Python code inside a signal handler or a second thread (forking stays safe).
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
from collections.abc import Iterator

CONTROL = "control"
CHILD = "child"


class ForkLoop:
    def __init__(self, control: socket.socket) -> None:
        self._wakeup_r, self._wakeup_w = os.pipe()
        os.set_blocking(self._wakeup_w, False)
        signal.set_wakeup_fd(self._wakeup_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self._selector = selectors.DefaultSelector()
        self._selector.register(control, selectors.EVENT_READ, CONTROL)
        self._selector.register(self._wakeup_r, selectors.EVENT_READ, CHILD)
        # The server's own descriptors, which a forked child closes (`leave`).
        self.fds = [control.fileno(), self._wakeup_r, self._wakeup_w, self._selector.fileno()]

    def events(self) -> Iterator[str]:
        """Wait; then `CONTROL` when a request can be read, `CHILD` when children may
        have exited (reap them with `os.waitpid(-1, os.WNOHANG)` until none is left)."""
        for key, _ in self._selector.select():
            if key.data == CHILD:
                os.read(self._wakeup_r, 4096)
            yield key.data

    def leave(self) -> None:
        """In a forked child: the default SIGCHLD again, and none of the server's fds."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in self.fds:
            os.close(fd)
