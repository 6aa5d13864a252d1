# Page the on-call person when any decision channel gives up, through a pager command
# that is not one of the channels (so a broken channel cannot hide its own failure).
import os
import subprocess

from pi_workflows.plugin import hookimpl


@hookimpl
def piw_channel_gave_up(gave_up):
    pager = os.environ.get("PAGER_COMMAND")
    if not pager:
        return
    text = (
        f"decision channel {gave_up.channel_name} gave up the {gave_up.purpose} of "
        f"decision {gave_up.request['decisionId']} after {gave_up.attempts} attempts; "
        f"once it works: pi-workflows effects retry {gave_up.effect_id}"
    )
    # Started, not waited for: a notification must return within the hook deadline.
    subprocess.Popen([pager, text], stdin=subprocess.DEVNULL)
