"""Shell actions: one command in its own process group, bounded in time and output.

Whatever ends the command — its own `timeout_ms`, the node deadline, cancel or park —
the whole process group is stopped (SIGTERM, then SIGKILL after a grace period), so no
child the command started survives it.
"""

from __future__ import annotations

import os
import shutil
import signal as signals
import subprocess
import threading
import time
from collections.abc import Mapping
from typing import IO, Any

from ..errors import PiWorkflowsError
from .context import AbortSignal, NodeAborted, NodeTimedOut
from .processes import start_registered, unregister

DEFAULT_MAX_OUTPUT_CHARS = 1_000_000
KILL_GRACE_SECONDS = 1.0
# After the command exits, children still holding its pipes get this long to finish.
DRAIN_SECONDS = 0.5
POLL_SECONDS = 0.02
SPEC_KEYS = frozenset(
    {
        "command",
        "args",
        "cwd",
        "env",
        "stdin",
        "shell",
        "timeout_ms",
        "max_output_chars",
        "allowNonZeroExit",
    }
)


class ShellSpecError(PiWorkflowsError):
    """`exec(ctx)` returned something that does not describe a command."""


class ShellCommandFailed(PiWorkflowsError):
    """The command exited non-zero and the spec did not allow it."""


def check_spec(spec: Any) -> dict[str, Any]:
    if not isinstance(spec, Mapping):
        raise ShellSpecError(f"shell exec must return a mapping, got {type(spec).__name__}")
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise ShellSpecError(
            f"shell exec returned unknown keys {unknown}; allowed: {sorted(SPEC_KEYS)}"
        )
    command = spec.get("command")
    if not isinstance(command, str) or not command:
        raise ShellSpecError("shell exec must return a non-empty 'command' string")
    args = spec.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ShellSpecError("shell 'args' must be a list of strings")
    env = spec.get("env", {})
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ShellSpecError("shell 'env' must map strings to strings")
    for key in ("timeout_ms", "max_output_chars"):
        value = spec.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ShellSpecError(f"shell {key!r} must be a positive integer")
        if value is not None and value <= 0:
            raise ShellSpecError(f"shell {key!r} must be a positive integer")
    if "stdin" in spec and not isinstance(spec["stdin"], str):
        raise ShellSpecError("shell 'stdin' must be a string")
    return dict(spec)


class _BoundedReader(threading.Thread):
    """Drains one pipe, keeping at most `limit` characters."""

    def __init__(self, pipe: IO[bytes], limit: int) -> None:
        super().__init__(daemon=True)
        self.pipe = pipe
        self.limit = limit
        self.chunks: list[bytes] = []
        self.kept = 0
        self.truncated = False

    def run(self) -> None:
        # Keep reading past the limit so the command never blocks on a full pipe.
        # A Popen pipe is a BufferedReader; read1 returns what is there without waiting.
        for chunk in iter(lambda: self.pipe.read1(65536), b""):  # type: ignore[attr-defined]
            room = self.limit - self.kept
            if room > 0:
                self.chunks.append(chunk[:room])
                self.kept += min(room, len(chunk))
            if len(chunk) > room:
                self.truncated = True

    def text(self) -> str:
        text = b"".join(self.chunks).decode("utf-8", errors="replace")[: self.limit]
        if self.truncated:
            text += f"\n[output truncated at {self.limit} characters]"
        return text


def kill_group(process_group: int) -> None:
    """SIGTERM the group, SIGKILL whatever is left after the grace period."""
    try:
        os.killpg(process_group, signals.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + KILL_GRACE_SECONDS
    while time.monotonic() < deadline:
        try:
            os.killpg(process_group, 0)
        except ProcessLookupError:
            return
        time.sleep(POLL_SECONDS)
    try:
        os.killpg(process_group, signals.SIGKILL)
    except ProcessLookupError:
        return


def run_shell(spec: Mapping[str, Any], abort: AbortSignal, kind: str = "shell") -> dict[str, Any]:
    """Run the command of a checked spec; returns the `ShellActionResult`.

    The command's process group is registered with the host (`kind`: `shell` for a
    shell action, `agent` for an agent executor) before the command runs.

    Raises :class:`NodeTimedOut` when the command's own `timeout_ms` passed and
    :class:`NodeAborted` when the attempt ended first.
    """
    spec = check_spec(spec)
    args = list(spec.get("args", []))
    argv = (
        ["/bin/sh", "-c", spec["command"], "sh", *args]
        if spec.get("shell")
        else [
            spec["command"],
            *args,
        ]
    )
    cwd = os.path.abspath(spec.get("cwd") or os.getcwd())
    limit = spec.get("max_output_chars") or DEFAULT_MAX_OUTPUT_CHARS
    timeout_ms = spec.get("timeout_ms")
    started = time.monotonic()
    deadline = started + timeout_ms / 1000 if timeout_ms else None
    env = {**os.environ, **spec.get("env", {})}
    # The gate shell would report a missing program only as exit status 127.
    if not spec.get("shell") and shutil.which(argv[0], path=env.get("PATH")) is None:
        raise ShellCommandFailed(f"Cannot run {spec['command']!r}: no such executable program")
    try:
        process = start_registered(
            argv,
            kind=kind,
            keep_stdin="stdin" in spec,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        raise ShellCommandFailed(f"Cannot run {spec['command']!r}: {exc.strerror}") from exc
    assert process.stdout is not None and process.stderr is not None  # both are PIPEs
    readers = [_BoundedReader(process.stdout, limit), _BoundedReader(process.stderr, limit)]
    for reader in readers:
        reader.start()
    if "stdin" in spec:
        threading.Thread(target=_feed, args=(process.stdin, spec["stdin"]), daemon=True).start()
    stopped_by: str | None = None
    while process.poll() is None:
        if abort.is_aborted:
            stopped_by = "abort"
        elif deadline is not None and time.monotonic() >= deadline:
            stopped_by = "timeout"
        if stopped_by:
            kill_group(process.pid)
            process.wait()
            break
        abort.wait(POLL_SECONDS)
    for reader in readers:
        reader.join(DRAIN_SECONDS)
    if any(reader.is_alive() for reader in readers):
        # A background child still holds the pipes open: it belongs to the command.
        kill_group(process.pid)
        for reader in readers:
            reader.join()
    else:
        kill_group_quietly(process.pid)
    unregister(process)
    duration_ms = int((time.monotonic() - started) * 1000)
    if stopped_by == "abort":
        raise NodeAborted(f"Shell command {spec['command']!r} was stopped ({abort.reason}).")
    if stopped_by == "timeout":
        raise NodeTimedOut(f"Shell command {spec['command']!r} timed out after {timeout_ms} ms")
    exit_code = process.returncode
    result = {
        "command": spec["command"],
        "args": args,
        "cwd": cwd,
        "stdout": readers[0].text(),
        "stderr": readers[1].text(),
        "exitCode": exit_code if exit_code >= 0 else None,
        "signal": signals.Signals(-exit_code).name if exit_code < 0 else None,
        "durationMs": duration_ms,
    }
    if exit_code != 0 and not spec.get("allowNonZeroExit"):
        detail = result["stderr"].strip().splitlines()[-1:] or [""]
        raise ShellCommandFailed(
            f"Shell command {spec['command']!r} exited with {exit_code}"
            + (f": {detail[0]}" if detail[0] else "")
        )
    return result


def kill_group_quietly(process_group: int) -> None:
    """Stop leftovers of a finished command that no longer hold its pipes."""
    try:
        os.killpg(process_group, signals.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return


def _feed(pipe: IO[bytes], text: str) -> None:
    try:
        pipe.write(text.encode("utf-8"))
        pipe.close()
    except (BrokenPipeError, OSError):
        return
