"""Worker entry: handshake, load and verify the saved workflow, execute, say goodbye.

The protocol owns the process's original stdin/stdout; workflow code that prints
writes to stderr instead, which the host keeps as a bounded diagnostic.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import IO, Any

from .. import worker_memory
from ..errors import ClaimLostError, PiWorkflowsError, WorkflowSourceChangedError
from ..protocol.worker_messages import LAUNCH_SCHEMA, PROTOCOL_VERSION, WorkerOperation
from . import process_limits
from .command import EXIT_CLAIM_LOST, EXIT_FAILED, EXIT_OK, LAUNCH_ENV
from .host_backend import HostRunBackend
from .host_pipe import HostPipe


def _claim_protocol_streams() -> tuple[IO[bytes], IO[bytes]]:
    """Keep private copies of stdin/stdout for the protocol; point fd 0/1 elsewhere."""
    protocol_in = os.fdopen(os.dup(0), "rb")
    protocol_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return protocol_in, protocol_out


def parse_envelope(raw: str | None) -> dict[str, Any]:
    if not raw:
        raise SystemExit(
            f"pi-workflows worker: {LAUNCH_ENV} is missing; workers are started by the host."
        )
    try:
        envelope = json.loads(raw)
    except json.JSONDecodeError:
        raise SystemExit(f"pi-workflows worker: {LAUNCH_ENV} is not valid JSON.") from None
    if (
        not isinstance(envelope, dict)
        or envelope.get("schema") != LAUNCH_SCHEMA
        or envelope.get("protocolVersion") != PROTOCOL_VERSION
    ):
        raise SystemExit(f"pi-workflows worker: {LAUNCH_ENV} is not a v1 launch envelope.")
    return envelope


def main(argv: list[str] | None = None) -> int:
    process_limits.apply_own()  # before any workflow code runs
    envelope = parse_envelope(os.environ.get(LAUNCH_ENV))
    worker_memory.apply_from_environment()
    protocol_in, protocol_out = _claim_protocol_streams()
    pipe = HostPipe(envelope, protocol_in, protocol_out)
    try:
        return _run(pipe, envelope)
    except ClaimLostError as error:
        print(f"pi-workflows worker: stopping, {error}", file=sys.stderr)
        return EXIT_CLAIM_LOST
    except MemoryError:
        limit = worker_memory.note()
        print(f"pi-workflows worker: out of memory{': ' + limit if limit else ''}", file=sys.stderr)
        return worker_memory.EXIT_OUT_OF_MEMORY
    except PiWorkflowsError as error:
        print(f"pi-workflows worker: {error}", file=sys.stderr)
        return EXIT_FAILED


def _run(pipe: HostPipe, envelope: dict[str, Any]) -> int:
    from ..discovery import load_from_source
    from ..engine import execute_command

    # Load before saying ready: the host's startup deadline then also stops a worker
    # whose workflow hangs at import.
    try:
        definition = load_from_source(envelope["workflowSource"], envelope["definitionDigest"])
    except WorkflowSourceChangedError as error:
        pipe.call(
            WorkerOperation.EXITING,
            {"status": "workflowSourceChanged", "error": str(error)},
            control=True,
        )
        return EXIT_FAILED
    except Exception as error:  # any import-time failure of user code is a load failure
        traceback.print_exc()
        pipe.call(
            WorkerOperation.EXITING,
            {"status": "workflowLoadFailed", "error": f"{type(error).__name__}: {error}"},
            control=True,
        )
        return EXIT_FAILED
    ready = pipe.ready()
    first_reads: dict[str | None, dict[str, Any]] = (
        {None: ready["runState"]} if ready.get("runState") is not None else {}
    )
    if ready.get("parentRunState") is not None:
        first_reads[ready["command"]["parentRunId"]] = ready["parentRunState"]
    backend = HostRunBackend(pipe, first_reads)
    outcome = execute_command(definition, backend, ready["command"])
    backend.finish(outcome["status"])  # the run's last write, if held back, goes with it
    return EXIT_OK
