# An executor that answers every step with a fixed output (for dry runs of a workflow).
from pi_workflows.plugin import hookimpl


class DryRunExecutor:
    def run_agent_step(self, request, signal):
        contract = request["contract"]
        return {"output": {"dryRun": True, "step": contract["nodeId"]}}


@hookimpl
def piw_register_agent_executors(register):
    # Used when the host runs with PI_WORKFLOWS_AGENT_EXECUTOR=dry-run.
    register("dry-run", DryRunExecutor)
