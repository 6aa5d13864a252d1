# Run every worker under `nice -n 10`, keeping the built-in command and environment.
from pi_workflows.plugin import WorkerProcessSpec, default_worker_process, hookimpl


@hookimpl
def piw_worker_process(envelope, settings):
    spec = default_worker_process(envelope, settings)
    return WorkerProcessSpec(argv=["nice", "-n", "10", *spec.argv], env=spec.env, cwd=spec.cwd)
