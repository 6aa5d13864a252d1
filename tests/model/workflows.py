"""The workflows the model test drives, and the plugin and agent it runs them with.

Every node appends ``<key> <node>`` to the side-effect log named by the run's input (one
`write` of a short line with O_APPEND: lines never interleave), so the test counts how
often each node of each run lineage ran. Nodes that should last (for a pause, a cancel or
a kill to land while they run) wait until the run's gate file exists.
"""

from __future__ import annotations

LOG_HELPERS = """
import os, time

def log(ctx, node):
    fd = os.open(ctx.input["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{ctx.input['key']} {node}\\n".encode())
    finally:
        os.close(fd)

def gate(ctx):
    while not os.path.exists(ctx.input["gate"]):
        ctx.signal.raise_if_aborted()
        time.sleep(0.02)
"""

# The shell nodes log with the same line format as `log`.
SHELL_LOG = 'printf "%s %s\\n" "$1" "$2" >> "$0"'


def shell_workflow(name: str, effect: str, logged_as: str) -> str:
    """A shell node with `effect` that logs `<key> <logged_as>`, then a compute node."""
    return (
        LOG_HELPERS
        + f"""
from pi_workflows import compute, edge, {effect}, shell, workflow

def command(ctx):
    gate(ctx)
    return {{"command": "sh", "args": ["-c", {SHELL_LOG!r}, ctx.input["log"],
                                      ctx.input["key"], {logged_as!r}]}}

WORKFLOW = workflow(name={name!r}, start_at="effect", edges=[edge("effect", "after")],
                    nodes={{"effect": shell(command, effect={effect}("append")),
                           "after": compute(lambda ctx: {{"ok": True}})}})
"""
    )


WORKFLOWS = {
    "chain": LOG_HELPERS
    + """
from pi_workflows import compute, edge, workflow

def first(ctx):
    gate(ctx)
    log(ctx, "first")
    return {"first": True}

def second(ctx):
    log(ctx, "second")
    return {"done": ctx.input["key"]}

WORKFLOW = workflow(name="chain", start_at="first", edges=[edge("first", "second")],
                    nodes={"first": compute(first), "second": compute(second)})
""",
    "branch": LOG_HELPERS
    + """
from pi_workflows import compute, switch, workflow

def pick(ctx):
    log(ctx, "pick")
    return {"route": ctx.input.get("route", "left")}

def lane(name):
    def run(ctx):
        gate(ctx)
        log(ctx, name)
        return {"lane": name}
    return run

WORKFLOW = workflow(name="branch", start_at="pick",
                    nodes={"pick": compute(pick), "left": compute(lane("left")),
                           "right": compute(lane("right"))},
                    edges=[switch("pick", on="$.route", cases={"left": "left", "right": "right"})])
""",
    "idempotent": shell_workflow("idempotent", "idempotent_effect", "effect"),
    "manual": shell_workflow("manual", "manual_effect", "manual"),
    "checkpoint": LOG_HELPERS
    + """
from pi_workflows import checkpoint, compute, edge, workflow

def before(ctx):
    log(ctx, "before")
    return {"asked": True}

def after(ctx):
    log(ctx, "after")
    return {"answer": ctx.input}

WORKFLOW = workflow(name="checkpoint", start_at="before",
                    edges=[edge("before", "ask"), edge("ask", "after")],
                    nodes={"before": compute(before), "ask": checkpoint(summary="go on?"),
                           "after": compute(after)})
""",
    "decision": LOG_HELPERS
    + """
from pi_workflows import choice, compute, edge, human_decision, switch, workflow

def propose(ctx):
    log(ctx, "propose")
    return {"plan": ctx.input["key"]}

def ending(name):
    def run(ctx):
        log(ctx, name)
        return {"choice": ctx.outputs["approve"]["choice"]}
    return run

WORKFLOW = workflow(name="decision", start_at="propose",
    nodes={"propose": compute(propose),
           "approve": human_decision(
               audience="operator",
               choices={"ship": choice("Ship"), "stop": choice("Stop")},
               request=lambda ctx: {"title": "Ship?", "subject": ctx.outputs["propose"],
                                    "presentation": {"summary": "ready", "blocks": []}},
               on_timeout={"after_ms": 4000, "response": {"choice": "stop"}}),
           "shipped": compute(ending("shipped")), "stopped": compute(ending("stopped"))},
    edges=[edge("propose", "approve"),
           switch("approve", on="$.choice", cases={"ship": "shipped", "stop": "stopped"})])
""",
    "agent": LOG_HELPERS
    + """
from pi_workflows import agent, compute, edge, workflow

def prompt(ctx):
    return f"MODE={ctx.input['mode']} KEY={ctx.input['key']} LOG={ctx.input['log']}"

def done(ctx):
    log(ctx, "done")
    return ctx.outputs["step"]

WORKFLOW = workflow(name="agent", start_at="step", edges=[edge("step", "done")],
                    nodes={"step": agent(prompt, expected_output='{"answer": "..."}',
                                         timeout_ms=3000),
                           "done": compute(done)})
""",
}

# The headless agent (`command` executor): submits, submits output the step rejects, or
# never submits (the step's deadline ends it). It logs each time it is asked.
AGENT = """
import json, os, re, sys, time
prompt = sys.stdin.read()
fields = dict(re.findall(r"(MODE|KEY|LOG)=(\\S+)", prompt))
fd = os.open(fields["LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
os.write(fd, f"{fields['KEY']} agent\\n".encode())
os.close(fd)
if fields["MODE"] == "submits":
    print(json.dumps({"answer": fields["KEY"]}))
elif fields["MODE"] == "rejects":
    print("no JSON here")
else:
    time.sleep(3600)
"""

# A claim veto the test toggles: a run whose key is listed in the veto file is not claimed.
# Every answer is appended to the asked file ("KEY allow|veto MS"), so the test can tell a
# claim the veto should have stopped from one whose "allow" came just before the veto did.
VETO_PLUGIN = """
import time
from pi_workflows import hookimpl

VETO_FILE = {path!r}
ASKED_FILE = {asked!r}

@hookimpl
def piw_may_claim(run, host):
    key = (run.input or {{}}).get("key") if isinstance(run.input, dict) else None
    try:
        vetoed = set(open(VETO_FILE).read().split())
    except FileNotFoundError:
        vetoed = set()
    verdict = "veto" if key in vetoed else "allow"
    with open(ASKED_FILE, "a") as asked:
        asked.write(f"{{key}} {{verdict}} {{int(time.time() * 1000)}}\\n")
    return False if verdict == "veto" else None
"""
