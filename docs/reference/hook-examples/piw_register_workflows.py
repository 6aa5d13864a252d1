# Ship a workflow inside the plugin's distribution.
from pi_workflows import compute, workflow
from pi_workflows.plugin import hookimpl

PING = workflow(
    name="ping",
    start_at="pong",
    nodes={"pong": compute(lambda ctx: {"pong": True})},
    edges=[],
)


@hookimpl
def piw_register_workflows(register):
    register("ping", PING, revision="1")
