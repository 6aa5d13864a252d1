"""Workflow sources the host tests install into a project's `.pi/workflows/`."""

# a → b → c; every node appends its name to <project>/trace; b records the worker pid
# and blocks until <project>/release-b exists, so a test can kill the worker inside b.
STEPS = """
import os
import time
from pathlib import Path

from pi_workflows import compute, edge, workflow

TRACE = Path.cwd() / "trace"


def _mark(name):
    with open(TRACE, "a") as handle:
        handle.write(name + "\\n")


def a(ctx):
    _mark("a")
    return {"a": 1}


def b(ctx):
    _mark("b")
    (Path.cwd() / "b.pid").write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not (Path.cwd() / "release-b").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("release-b never appeared")
        time.sleep(0.02)
    return {"b": 2}


def c(ctx):
    _mark("c")
    return {"sum": ctx.outputs["a"]["a"] + ctx.outputs["b"]["b"]}


WORKFLOW = workflow(
    name="steps",
    start_at="a",
    nodes={"a": compute(a), "b": compute(b), "c": compute(c)},
    edges=[edge("a", "b"), edge("b", "c")],
)
"""

# Kills its own worker at import while <project>/crash-on-load exists: a worker that
# dies before it commits any workflow progress. (The client imports it too, to resolve
# it, so only a worker process — one with a launch envelope — dies.)
CRASHY = """
import os
import signal
from pathlib import Path

from pi_workflows import compute, workflow

if "PI_WORKFLOWS_WORKER_LAUNCH" in os.environ and (Path.cwd() / "crash-on-load").exists():
    os.kill(os.getpid(), signal.SIGKILL)

WORKFLOW = workflow(
    name="crashy",
    start_at="only",
    nodes={"only": compute(lambda ctx: {"survived": True})},
    edges=[],
)
"""

# One node that blocks until <project>/release exists (for pause/cancel of live runs).
BLOCKER = """
import os
import time
from pathlib import Path

from pi_workflows import compute, workflow


def wait(ctx):
    (Path.cwd() / "blocker.pid").write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not (Path.cwd() / "release").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("release never appeared")
        time.sleep(0.02)
    return {"released": True}


WORKFLOW = workflow(
    name="blocker",
    start_at="wait",
    nodes={"wait": compute(wait)},
    edges=[],
)
"""

# A local plugin (loaded through PI_WORKFLOWS_PLUGINS) that launches the next worker of
# a run with a stale generation once <project>/stale-next exists.
STALE_LAUNCH_PLUGIN = """
import dataclasses
import json
from pathlib import Path

from pi_workflows import hookimpl
from pi_workflows.builtin import launch


@hookimpl
def piw_worker_process(envelope, settings):
    marker = Path(envelope["projectPath"]) / "stale-next"
    if envelope["generation"] < 2 or not marker.exists():
        return None
    marker.unlink()
    spec = launch.piw_worker_process(envelope, settings)
    stale = dict(envelope, generation=envelope["generation"] - 1)
    env = dict(spec.env, **{launch.LAUNCH_ENV: json.dumps(stale)})
    return dataclasses.replace(spec, env=env)
"""

# While `<project>/hold-claims` exists, no run is claimed (the host runs in the project).
HOLD_CLAIMS_PLUGIN = """
from pathlib import Path

from pi_workflows import hookimpl


@hookimpl
def piw_may_claim(run, host):
    return not (Path.cwd() / "hold-claims").exists()
"""

# A checkpoint: the run ends `waiting`; a continuation carries the answer onward.
CHECKPOINTED = """
from pi_workflows import checkpoint, compute, edge, workflow

WORKFLOW = workflow(
    name="checkpointed",
    start_at="ask",
    nodes={
        "ask": checkpoint(summary="Need an answer"),
        "use": compute(lambda ctx: {"answer": ctx.outputs["ask"]}),
    },
    edges=[edge("ask", "use")],
)
"""

# A local plugin whose worker never says ready (for the startup deadline).
SILENT_WORKER_PLUGIN = """
import sys

from pi_workflows import hookimpl
from pi_workflows.plugin import WorkerProcessSpec


@hookimpl
def piw_worker_process(envelope, settings):
    code = "import os, time; open('silent.pid', 'w').write(str(os.getpid())); time.sleep(300)"
    return WorkerProcessSpec(argv=[sys.executable, "-c", code], cwd=envelope["projectPath"])
"""


def slow_shell(policy: str) -> str:
    """`slowshell`: one shell node with an `<policy>_effect`, then a compute node.

    The command appends to <project>/starts each time it runs, forks a child that forks
    a grandchild (pids in child.pid and grandchild.pid, its own pid in shell.pid), and
    finishes once <project>/release exists.
    """
    return f'''
from pi_workflows import compute, edge, {policy}_effect, shell, workflow

SCRIPT = """
echo started >> starts
sh -c 'sleep 300 >/dev/null 2>&1 & echo $! > grandchild.pid; wait' >/dev/null 2>&1 &
echo $! > child.pid
echo $$ > shell.pid
while [ ! -e release ]; do sleep 0.05; done
printf done
"""

WORKFLOW = workflow(
    name="slowshell",
    start_at="work",
    nodes={{
        "work": shell(
            exec=lambda ctx: {{"command": SCRIPT, "shell": True}},
            effect={policy}_effect("work"),
        ),
        "after": compute(lambda ctx: {{"work": ctx.outputs["work"]}}),
    }},
    edges=[edge("work", "after")],
)
'''


# a → b → c; b is an action that publishes an update and then waits for
# <project>/release-b, so a follower can see the run mid-way.
WATCHED = """
import time
from pathlib import Path

from pi_workflows import action, compute, edge, idempotent_effect, workflow


def b(ctx):
    ctx.publish_update("progress", "b", {"done": 1})
    deadline = time.monotonic() + 120
    while not (Path.cwd() / "release-b").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("release-b never appeared")
        time.sleep(0.02)
    return {"b": 2}


WORKFLOW = workflow(
    name="watched",
    start_at="a",
    nodes={
        "a": compute(lambda ctx: {"a": 1}),
        "b": action(b, idempotent_effect("b")),
        "c": compute(lambda ctx: {"sum": ctx.outputs["a"]["a"] + ctx.outputs["b"]["b"]}),
    },
    edges=[edge("a", "b"), edge("b", "c")],
)
"""

# One node that appends "a" to <project>/trace; in a worker, the import writes the
# worker's pid to <project>/import.pid and waits for <project>/release-import, so a test
# can act between the launch and worker.ready.
GATED_IMPORT = """
import os
import time
from pathlib import Path

from pi_workflows import compute, workflow

if "PI_WORKFLOWS_WORKER_LAUNCH" in os.environ:
    (Path.cwd() / "import.pid").write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not (Path.cwd() / "release-import").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("release-import never appeared")
        time.sleep(0.02)


def a(ctx):
    with open(Path.cwd() / "trace", "a") as handle:
        handle.write("a\\n")
    return {"a": 1}


WORKFLOW = workflow(name="gated", start_at="a", nodes={"a": compute(a)}, edges=[])
"""


# `pay`: a shell node with a manual effect whose command names its attempt (so each
# attempt's request differs), appends a line to <project>/charges each time it runs, writes
# its pid to <project>/shell.pid and finishes once <project>/release exists.
PAY = """
from pi_workflows import compute, edge, manual_effect, shell, workflow

SCRIPT = (
    "echo charged {attempt} >> charges; echo $$ > shell.pid; "
    "while [ ! -e release ]; do sleep 0.05; done; printf paid"
)

WORKFLOW = workflow(
    name="pay",
    start_at="pay",
    nodes={
        "pay": shell(
            exec=lambda ctx: {
                "command": "sh",
                "args": ["-c", SCRIPT.format(attempt=ctx.attempt_id)],
            },
            effect=manual_effect("payment"),
        ),
        "receipt": compute(lambda ctx: {"paid": ctx.outputs["pay"]["stdout"]}),
    },
    edges=[edge("pay", "receipt")],
)
"""

# a → b → c: each node appends "<n> <node>" to <project>/load-trace; b is a managed,
# idempotent effect that takes a moment, so a killed host has runs in flight. With
# `"hold": true` in its input, c waits for <project>/go: its host provably holds the run.
LOAD = """
import time
from pathlib import Path

from pi_workflows import action, compute, edge, idempotent_effect, workflow

TRACE = Path.cwd() / "load-trace"


def _mark(ctx, node):
    with open(TRACE, "a") as handle:
        handle.write(f"{ctx.input['n']} {node}\\n")


def a(ctx):
    _mark(ctx, "a")
    return {"n": ctx.input["n"]}


def b(ctx):
    _mark(ctx, "b")
    time.sleep(0.05)
    return {"sent": ctx.input["n"]}


def c(ctx):
    _mark(ctx, "c")
    deadline = time.monotonic() + 120
    while ctx.input.get("hold") and not (Path.cwd() / "go").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("go never appeared")
        time.sleep(0.05)
    return {"done": ctx.input["n"]}


WORKFLOW = workflow(
    name="load",
    start_at="a",
    nodes={
        "a": compute(a),
        "b": action(b, effect=idempotent_effect("load.send")),
        "c": compute(c),
    },
    edges=[edge("a", "b"), edge("b", "c")],
)
"""


# a → b → c, each a shell command that appends its node's name to <project>/effects when
# it is done; b first appends its shell's pid to <project>/b.pids and waits for
# <project>/release-b.
GATED_SHELLS = '''
from pi_workflows import edge, idempotent_effect, shell, workflow

GATE = """
echo $$ >> b.pids
while [ ! -e release-b ]; do sleep 0.05; done
"""


def step(node, gated=False):
    script = (GATE if gated else "") + f"echo {node} >> effects\\n"
    return shell(
        exec=lambda ctx: {"command": script, "shell": True}, effect=idempotent_effect(node)
    )


WORKFLOW = workflow(
    name="gated",
    start_at="a",
    nodes={"a": step("a"), "b": step("b", gated=True), "c": step("c")},
    edges=[edge("a", "b"), edge("b", "c")],
)
'''

# The relay between host and worker: `from_host(frame)` says whether a host frame goes on
# to the worker, `from_worker(message)` how many copies of a worker message go to the host
# (decided before any goes out: a line over the pipe's buffer leaves at once).
_RELAY = r"""
import json, os, subprocess, sys, threading
{hooks}
worker = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def to_worker():
    for line in sys.stdin.buffer:
        if from_host(json.loads(line)):
            worker.stdin.write(line)
            worker.stdin.flush()
    worker.stdin.close()


threading.Thread(target=to_worker, daemon=True).start()
for line in worker.stdout:
    for _ in range(from_worker(json.loads(line))):
        sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
# os._exit, not sys.exit: at interpreter shutdown the reader thread may still hold
# stdin's lock, and Python then aborts (SIGABRT), which the host rightly counts as a
# crash and runs the worker again.
os._exit(worker.wait())
"""
_RELAYED_WORKER = """
import dataclasses
import sys

from pi_workflows import hookimpl
from pi_workflows.builtin import launch

RELAY = {relay!r}


@hookimpl
def piw_worker_process(envelope, settings):
    spec = launch.piw_worker_process(envelope, settings)
    return dataclasses.replace(
        spec, argv=[sys.executable, "-c", RELAY, *spec.argv], forkable=False
    )
"""


def relayed_worker_plugin(hooks: str) -> str:
    """A plugin that runs the built-in worker behind a relay (a Python script on the
    worker's pipes; the worker is then spawned, not forked) whose `hooks` define
    `from_host(frame) -> bool` and `from_worker(message) -> int` (see _RELAY)."""
    return _RELAYED_WORKER.format(relay=_RELAY.replace("{hooks}", hooks))


# The built-in worker behind a relay that sends its first write to the host twice, as a
# worker that lost the reply and asked again would, and logs the host's two replies to
# <project>/replies.jsonl instead of passing the second to the worker.
RESENDING_WORKER_PLUGIN = relayed_worker_plugin(
    r"""
READS = {"worker.ready", "worker.exiting", "store.readRunState"}
resent = []
seen = 0


def from_host(frame):
    global seen
    if resent and frame.get("messageId") == resent[0]:
        seen += 1
        with open("replies.jsonl", "a") as log:
            log.write(json.dumps(frame) + "\n")
        return seen != 2
    return True


def from_worker(message):
    if not resent and message["operation"] not in READS:
        resent.append(message["messageId"])
        return 2
    return 1
"""
)

# What its worker process holds: whether the host's own modules are among its imports,
# and which process forked it.
WORKER_MODULES = """
import os
import sys

from pi_workflows import compute, workflow


def look(ctx):
    return {"hostImported": "pi_workflows.host.runtime" in sys.modules, "parent": os.getppid()}


WORKFLOW = workflow(name="modules", start_at="look", nodes={"look": compute(look)}, edges=[])
"""
