"""Agent-step overhead of the `pi` executor (issue 10): prints p50/p95 for cold and warm steps.

    python benchmarks/pi_step_bench.py [--cold 8] [--warm 20] [--system-node]

Drives `piw_pi.executor.PiExecutor` with the real `pi` (plugins/pi-workflows-pi, `npm ci`
first) against the test bed's scripted model server (tests/pi/model_server.py), offline,
exactly as a worker does: the step request carries the engine's `accept` callback, and the
scripted model submits at once. Overhead of one step = from handing the prompt to the
executor to the submit being accepted, minus the time the model server spent answering.

  cold: the first step of a run — pi starts (node, Pi, the bridge extension) when the
        step asks for it;
  early: the first step of a run as a worker runs it: the real engine (in process, on a
        real SQLite store) starts the run, calls the executor's `prepare()` — pi starts
        in the background — and hands over the prompt once it has recorded the run's and
        the step's start; pi's start-up minus that window is left on the step. The window
        (run start → prompt handed over) is printed too; in a host's worker it is a little
        longer (its snapshot writes are worker-protocol round trips);
  warm: a later step of the same run — the idle pi gets a fresh Pi session (`new_session`).

Cold minus warm is what keeping one pi per run saves on every step after the first.

pi is started the way the executor starts it by default: on the Node that `npm ci` installed
next to Pi, through the compile-cache launcher (piw_pi/node.py), with the cache in the
benchmark's throwaway HOME; the first cold step fills the cache and is printed on its own.
`--system-node` adds a cold series started the way it was before that Node (`pi` from
node_modules/.bin on the system's Node, no cache), each of its steps right after one of
the default series, so both see the same load on a shared machine. Each cold step also
notes the CPU time pi used up to the accepted submit (all its threads), which the load
changes much less than the wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from piw_pi.executor import PiExecutor, PiSettings  # noqa: E402
from piw_pi.node import BUNDLED_PI, pi_on_bundled_node  # noqa: E402

from pi_workflows import agent, workflow  # noqa: E402
from pi_workflows.engine import Engine  # noqa: E402
from pi_workflows.engine.agents import AgentTranscript  # noqa: E402
from pi_workflows.engine.context import AbortSignal  # noqa: E402
from pi_workflows.engine.local_backend import LocalRunBackend  # noqa: E402
from pi_workflows.home import Home  # noqa: E402
from pi_workflows.storage import StateStore, open_state  # noqa: E402
from pi_workflows.storage.runs import create_run, new_run_id  # noqa: E402
from tests.pi.model_server import ScriptedModelServer  # noqa: E402
from tests.pi.offline_pi import PiHome  # noqa: E402
from tests.pi.step_replies import submit  # noqa: E402

# The shape of the built-in `echo`: one agent step, the run's first node.
ECHO = workflow("bench-echo", "reply", {"reply": agent("Say hello.")}, [])


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


@dataclass
class Step:
    """One measured agent step: its overhead and the CPU time pi had used by the submit."""

    overhead: float
    pi_cpu: float


def children_cpu_seconds() -> float:
    """User + system CPU time of this process's live children (pi and its threads)."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def one_step(executor: PiExecutor, server: ScriptedModelServer, index: int) -> Step:
    """One agent step whose model submits in its first reply."""
    server.script(submit({"reply": f"step {index}"}))
    before = len(server.requests)
    accepted_at: list[float] = []
    pi_cpu: list[float] = []

    def accept(output: Any) -> dict[str, Any]:
        accepted_at.append(time.monotonic())
        pi_cpu.append(children_cpu_seconds())
        return {"ok": True, "value": output}

    attempt = f"attempt-{index}"
    prompt = (
        "Say hello.\n\n---\nWorkflow step contract (workflow: bench, step: reply, "
        f"attempt: {attempt})\n\nComplete this step by calling the `workflow` tool exactly "
        f'once with:\n{{"action":"submit","step":"reply","attempt":"{attempt}",'
        '"output":<your result>}\n'
    )
    request = {
        "contract": {"runId": "bench", "nodeId": "reply", "attemptId": attempt},
        "prompt": prompt,
        "accept": accept,
        "publish_update": lambda *args: {},
        "transcript": AgentTranscript(),
    }
    started = time.monotonic()
    executor.run_agent_step(request, AbortSignal())
    (model,) = server.requests[before:]
    model_time = (model.finished_at or model.received_at) - model.received_at
    return Step(accepted_at[0] - started - model_time, pi_cpu[0])


def cold_step(settings: PiSettings, server: ScriptedModelServer, index: int) -> Step:
    """The first step on a pi started when the step asks for it."""
    executor = PiExecutor(settings)
    try:
        return one_step(executor, server, index)
    finally:
        executor.close()


class TimedExecutor:
    """The executor the engine is given: notes when the prompt is handed over and when
    the step's check accepts the submitted output."""

    def __init__(self, executor: PiExecutor) -> None:
        self.executor = executor
        self.handed_at = 0.0
        self.accepted_at = 0.0

    def prepare(self) -> None:
        self.executor.prepare()

    def run_agent_step(self, request: dict[str, Any], signal: AbortSignal) -> dict[str, Any]:
        self.handed_at = time.monotonic()
        accept = request["accept"]

        def timed_accept(output: Any) -> dict[str, Any]:
            verdict = accept(output)
            self.accepted_at = time.monotonic()
            return verdict

        return self.executor.run_agent_step({**request, "accept": timed_accept}, signal)


def early_step(
    settings: PiSettings, server: ScriptedModelServer, store: StateStore, project: Path
) -> tuple[float, float]:
    """(overhead, run start → prompt handed over) of the first step of a real engine run."""
    server.script(submit({"reply": "early"}))
    before = len(server.requests)
    run_id = new_run_id(ECHO.name)
    with store.transaction():
        create_run(
            run_id=run_id,
            workflow_name=ECHO.name,
            workflow_ref=ECHO.name,
            workflow_source={"kind": "builtin", "id": "bench", "revision": "1"},
            definition_digest=ECHO.definition_digest,
            project_path=str(project),
            input=None,
            actor="bench",
            execution_mode="headless",
        )
    timed = TimedExecutor(PiExecutor(settings))
    engine = Engine(ECHO, LocalRunBackend(store, run_id), agent_executor=timed)
    started = time.monotonic()
    outcome = engine.execute({"kind": "start", "input": None})
    timed.executor.close()
    assert outcome["status"] == "completed", outcome
    (model,) = server.requests[before:]
    model_time = (model.finished_at or model.received_at) - model.received_at
    return timed.accepted_at - timed.handed_at - model_time, timed.handed_at - started


def summary(label: str, values: list[float]) -> str:
    return (
        f"{label}: p50 {statistics.median(values) * 1000:.0f} ms, "
        f"p95 {percentile(values, 0.95) * 1000:.0f} ms (n={len(values)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", type=int, default=8, help="cold steps (a new pi each)")
    parser.add_argument("--warm", type=int, default=20, help="warm steps on one pi")
    parser.add_argument(
        "--system-node", action="store_true", help="also time cold steps the way before"
    )
    options = parser.parse_args()
    if not BUNDLED_PI.exists():
        raise SystemExit(f"{BUNDLED_PI} is missing: run `npm ci` in plugins/pi-workflows-pi")
    with tempfile.TemporaryDirectory(prefix="piw-bench-") as root, ScriptedModelServer() as server:
        home = PiHome(Path(root), server)
        os.environ.update(home.env)
        os.chdir(home.project)
        command = pi_on_bundled_node() or (str(BUNDLED_PI),)
        settings = PiSettings(command, home.model, ())
        before = PiSettings((str(BUNDLED_PI),), home.model, ()) if options.system_node else None
        first = cold_step(settings, server, 0)
        cold, cold_before = [], []
        for index in range(options.cold):
            cold.append(cold_step(settings, server, index))
            if before is not None:
                cold_before.append(cold_step(before, server, index))
        store = open_state(Home(Path(root) / "home"))
        early = [early_step(settings, server, store, home.project) for _ in range(options.cold)]
        store.close()
        executor = PiExecutor(settings)
        one_step(executor, server, -1)
        warm = [one_step(executor, server, index).overhead for index in range(options.warm)]
        executor.close()
    print(f"load average: {' '.join(f'{value:.1f}' for value in os.getloadavg())}")
    print(f"pi started with: {' '.join(settings.command)}")
    print(f"first cold step (an empty compile cache, if any): {first.overhead * 1000:.0f} ms")
    print(summary("cold step overhead (new pi)", [step.overhead for step in cold]))
    print(summary("  pi's CPU time by the submit", [step.pi_cpu for step in cold]))
    if cold_before:
        print(summary("cold, system Node (before)", [step.overhead for step in cold_before]))
        print(summary("  pi's CPU time by the submit", [step.pi_cpu for step in cold_before]))
    print(summary("cold step overhead, pi started at run start", [e[0] for e in early]))
    print(summary("  run start -> prompt handed over (overlaps pi's start)", [e[1] for e in early]))
    print(summary("warm step overhead (same pi, new session)", warm))
    saved = statistics.median(step.overhead for step in cold) - statistics.median(warm)
    print(f"saved per later step by keeping pi: {saved:.2f} s")


if __name__ == "__main__":
    main()
