# Run every worker 10 steps nicer and with at most 2 GiB of address space, keeping the
# built-in command, so workers are still forked from the pre-forked fork server.
import dataclasses

from pi_workflows.plugin import default_worker_process, hookimpl

TWO_GIB = 2 * 1024**3


@hookimpl
def piw_worker_process(envelope, settings):
    spec = default_worker_process(envelope, settings)
    return dataclasses.replace(spec, nice=10, rlimits={"RLIMIT_AS": (TWO_GIB, TWO_GIB)})
