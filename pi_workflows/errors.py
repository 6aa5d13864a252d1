"""Exception types, one per failure class of SPEC §15.

Every message is the sentence the user reads: one line, what was wrong, what to do.
"""

from __future__ import annotations


class PiWorkflowsError(Exception):
    """Base class; `str(error)` is a one-line, user-facing message."""


class UnsafeHomeError(PiWorkflowsError):
    """The state home is owned by another user or writable by others."""


class ReadOnlyHomeError(PiWorkflowsError):
    """The home cannot be written: a read-only filesystem or its permissions."""


class SchemaMismatchError(PiWorkflowsError):
    """The database belongs to another schema or schema version."""


class DatabaseUrlError(PiWorkflowsError):
    """A `--database` value that no storage plugin can open."""


class DatabaseUnavailableError(PiWorkflowsError):
    """The database server cannot be reached; nothing was read or written."""


class BlobConflictError(PiWorkflowsError):
    """Stored bytes under a content address do not match the content."""


class TransactionAborted(PiWorkflowsError):
    """An inner transaction failed, so the outer one must not commit."""


class PluginError(PiWorkflowsError):
    """A plugin raised inside a hook; the message names the plugin and the hook."""

    plugin_name: str = "unknown"


class UnansweredHookError(PluginError):
    """A hook the core needs an answer from got none (its built-in is disabled, say)."""


class PluginLoadError(PiWorkflowsError):
    """A plugin could not be imported or registered; the message names it."""

    plugin_name: str = "unknown"


class InvalidInputError(PiWorkflowsError):
    """Input JSON, ids or options that cannot be accepted."""


class WorkflowDefinitionError(PiWorkflowsError):
    """A workflow definition or file that cannot be used."""


class NotFoundError(PiWorkflowsError):
    """A run, workflow, decision or other record that does not exist."""


class ConflictError(PiWorkflowsError):
    """A repeated request whose payload differs from the first one."""


class RevisionConflictError(PiWorkflowsError):
    """A write that expected another revision of the run."""


class ClaimLostError(PiWorkflowsError):
    """A write by an owner whose claim is gone or belongs to a newer generation."""


class HostLeaseLostError(ClaimLostError):
    """This host's lease expired or was taken over: it may write nothing more."""


class HostAlreadyRunningError(PiWorkflowsError):
    """A second host on the same home."""


class HostUnavailableError(PiWorkflowsError):
    """No host answers on the socket and none may be started."""


class HostVersionError(PiWorkflowsError):
    """The host runs another pi-workflows version than the client."""


class HostProtocolError(PiWorkflowsError):
    """The host sent a message that breaks the client protocol (SPEC §8); the client drops
    the connection instead of guessing what was meant."""


class ClientClosedError(PiWorkflowsError):
    """A call on a client after its `close()`."""


class HostBusyError(PiWorkflowsError):
    """The host is running but refused the connection (too many connections)."""


class WorkflowSourceChangedError(PiWorkflowsError):
    """The saved workflow source (file hash, built-in revision or digest) no longer matches."""


class IncompleteTerminalStateError(PiWorkflowsError):
    """A run needs a terminal workflow message but its terminal state cannot be read yet."""


class TurnConflictError(PiWorkflowsError):
    """A session's turn or branch report contradicts what the host saved (or its fencing)."""


class RunStillOwnedError(TurnConflictError):
    """A turn end could not fail or pause its step's run: a worker still holds the run."""


class ChannelConfigError(PiWorkflowsError):
    """The decision channel configuration file cannot be used (format, mode, credentials)."""


class ChannelDeliveryError(PiWorkflowsError):
    """A decision channel could definitely not deliver or settle; the host retries it."""


class AnswerNotAllowedError(PiWorkflowsError):
    """A decision answer from a channel or actor the configuration does not allow."""


class RunWaitTimedOut(PiWorkflowsError, TimeoutError):
    """A client gave up waiting for a run to settle (`--wait --timeout`, `run watch`)."""
