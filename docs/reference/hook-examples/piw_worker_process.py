# Run every worker under `nice -n 10`, keeping the built-in command and environment.
from pi_workflows import hookimpl
from pi_workflows.builtin import launch  # the module: importing its hook function by name
from pi_workflows.records import WorkerProcessSpec  # would register it again, as yours


@hookimpl
def piw_worker_process(envelope, settings):
    spec = launch.piw_worker_process(envelope, settings)
    return WorkerProcessSpec(argv=["nice", "-n", "10", *spec.argv], env=spec.env, cwd=spec.cwd)
