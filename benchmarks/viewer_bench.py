"""Viewer benchmarks (issue 25): prints how fast `pi-workflows view` opens and follows.

    python benchmarks/viewer_bench.py [--runs 10000] [--opens 10] [--steps 20]

Seeds a private home with RUNS finished runs (through the storage API, before the host
starts), starts a host as a user runs it (default timers), then, with the app driven
headless by Textual's Pilot at 80×24 (`App.run_test`, the same app as the terminal's):
  1. runs list open: from creating the app to its table showing the first page
     (OPENS times; p50, p95, max);
  2. node change → run view: a workflow of STEPS compute steps (each sleeps 0.1 s) runs
     while its run view is open; for each step, from the host's commit of the node's end
     (a plugin's `piw_node_attempt_finished`, which the host calls after that commit,
     notes the time) to the view showing the step done (p50, p95, max).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from host_bench import percentile
from private_host import BenchHost, private_host

from pi_workflows.client import WorkflowClient
from pi_workflows.client.start_request import start_payload
from pi_workflows.testing.seeding import seed_finished_runs
from pi_workflows.view.app import ViewerApp
from pi_workflows.view.run_screen import RunData, RunScreen

SIZE = (80, 24)


def bench_open(client: WorkflowClient, opens: int, expected: int) -> list[tuple[float, float]]:
    """(wall ms, CPU ms of this process) from creating the app to its runs table showing
    a full first page. The CPU time is the viewer's own work, which a loaded machine
    stretches less than the wall time."""
    from textual.widgets import DataTable

    async def one() -> tuple[float, float]:
        began, cpu = time.perf_counter(), time.process_time()
        app = ViewerApp(client)
        async with app.run_test(size=SIZE) as pilot:
            while True:
                tables = app.screen.query(DataTable)
                if tables and tables.first().row_count >= expected:
                    return (
                        (time.perf_counter() - began) * 1000,
                        (time.process_time() - cpu) * 1000,
                    )
                await pilot.pause(0.001)

    return [asyncio.run(one()) for _ in range(opens)]


CHAIN = """\
import time
from pi_workflows import compute, edge, workflow

def step(ctx):
    time.sleep(0.1)
    return {{"at": time.time()}}

WORKFLOW = workflow(
    name="chain",
    start_at="s00",
    nodes={{f"s{{i:02d}}": compute(step) for i in range({steps})}},
    edges=[edge(f"s{{i:02d}}", f"s{{i + 1:02d}}") for i in range({steps} - 1)],
)
"""


class TimedRunScreen(RunScreen):
    """The run view, noting when each finished step is first shown."""

    shown_at: dict[str, float] = {}

    def _show(self, data: RunData) -> None:
        super()._show(data)
        now = time.time() * 1000
        for step in data.graph["steps"]:
            self.shown_at.setdefault(step["attemptId"], now)


def bench_follow(project: Path, client: WorkflowClient, commits: Path, steps: int) -> list[float]:
    """Per step: ms from the host committing its end to the run view showing it."""
    workflows = project / ".pi" / "workflows"
    workflows.mkdir(parents=True, exist_ok=True)
    (workflows / "chain.workflow.py").write_text(CHAIN.format(steps=steps))
    run_id = client.start_run(start_payload("chain", project))["runId"]

    class App(ViewerApp):
        def on_mount(self) -> None:
            self.push_screen(TimedRunScreen(run_id))

    async def follow() -> None:
        app = App(client, run_id)
        async with app.run_test(size=SIZE) as pilot:
            while len(TimedRunScreen.shown_at) < steps:
                await pilot.pause(0.01)

    asyncio.run(follow())
    committed = {}
    for line in commits.read_text().splitlines():
        attempt_id, at = line.split()
        committed[attempt_id] = float(at)
    return [TimedRunScreen.shown_at[a] - at for a, at in committed.items()]


# Loaded by the host (PI_WORKFLOWS_PLUGINS): notes when each node's end was committed.
COMMIT_CLOCK = """\
import os, time
from pi_workflows.plugin import hookimpl

@hookimpl
def piw_node_attempt_finished(attempt):
    with open(os.environ["PIW_BENCH_COMMITS"], "a") as out:
        out.write(f"{attempt.attempt_id} {time.time() * 1000}\\n")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--opens", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    def prepare(bench: BenchHost) -> None:
        (bench.root / "piw_bench_commit_clock.py").write_text(COMMIT_CLOCK)
        bench.env.update(
            PYTHONPATH=str(bench.root),
            PI_WORKFLOWS_PLUGINS="piw_bench_commit_clock",
            PIW_BENCH_COMMITS=str(bench.root / "commits.txt"),
        )
        seed_finished_runs(
            bench.home,
            bench.project,
            args.runs,
            first_created_at=int(time.time() * 1000) - args.runs * 60_000,
            step_ms=60_000,
        )

    with private_host("piw-view-", prepare) as bench:
        opens = bench_open(bench.client, args.opens, min(args.runs, 100))
        wall, cpu = [o[0] for o in opens], [o[1] for o in opens]
        print(
            f"runs list open with {args.runs} runs, first page of 100 shown ({args.opens} opens): "
            f"p50 {percentile(wall, 0.5):.0f} ms, p95 {percentile(wall, 0.95):.0f} ms, "
            f"max {max(wall):.0f} ms; the viewer's CPU p50 {percentile(cpu, 0.5):.0f} ms"
        )
        follow = bench_follow(bench.project, bench.client, bench.root / "commits.txt", args.steps)
        print(
            f"node end committed by the host -> shown in the run view ({len(follow)} steps): "
            f"p50 {percentile(follow, 0.5):.0f} ms, p95 {percentile(follow, 0.95):.0f} ms, "
            f"max {max(follow):.0f} ms"
        )


if __name__ == "__main__":
    main()
