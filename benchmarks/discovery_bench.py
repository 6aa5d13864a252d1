"""What isolating workflow discovery costs (issue 15 item 3): prints p50/p95 and ratios.

    python benchmarks/discovery_bench.py [--runs 30] [--files 1,10,50]

A project whose `.pi/workflows/` holds N small workflow files (one compute node each).
Each workflow file is loaded in a forked child with a deadline and a memory limit;
these rows show what that costs next to loading in the same process:

  load one file    `describe_one` (what `run start` does in the CLI: only the named file,
                   in a forked child) vs `load_file` in this process: the isolation alone;
  list N files     `describe_all` (one child per file, what the resolver process of
                   `pi-workflows workflows` does) vs `discover` in this process;
  run start        `pi-workflows run start NAME` against a live host, wall time of the
                   whole command, and the isolation's share of it.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from pathlib import Path

from timing import timed_samples

from pi_workflows import discovery
from pi_workflows.testing import WorkflowHost, short_temp_dir

WORKFLOW = """
from pi_workflows import compute, workflow

WORKFLOW = workflow(
    name="w{index}",
    start_at="only",
    nodes={{"only": compute(lambda ctx: {{"n": {index}}})}},
    edges=[],
)
"""


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


def _measure(action: Callable[[], object], runs: int) -> tuple[float, float]:
    return _percentiles(timed_samples(action, runs))


def _row(label: str, figures: tuple[float, float], base: tuple[float, float] | None) -> None:
    p50, p95 = figures
    ratio = f"{p50 / base[0]:6.1f}x" if base else "       "
    print(f"{label:<44} p50 {p50:8.1f} ms  p95 {p95:8.1f} ms  {ratio}")


def _project(host: WorkflowHost, count: int) -> Path:
    for index in range(count):
        host.write_workflow(f"w{index}", WORKFLOW.format(index=index))
    return host.project


def _bench(count: int, runs: int) -> None:
    host = WorkflowHost(short_temp_dir())
    try:
        project = _project(host, count)
        os.environ.update(host.env)  # the home's config dir, plugins and timers
        path = discovery.workflow_files(project)["w0"]
        in_process = _measure(lambda: discovery.load_file("w0", path).describe(), runs)
        isolated = _measure(lambda: discovery.describe_one("w0", project), runs)
        print(f"\n{count} workflow file(s)")
        _row("load one file, in process", in_process, None)
        _row("load one file, forked child (isolated)", isolated, in_process)
        listed_plain = _measure(lambda: discovery.discover(project), max(3, runs // 5))
        listed = _measure(lambda: discovery.describe_all(project), max(3, runs // 5))
        _row(f"list {count} files, in process", listed_plain, None)
        _row(f"list {count} files, a forked child each", listed, listed_plain)
        host.start()
        start = _measure(lambda: host.cli("run", "start", "w0"), runs)
        _row("pi-workflows run start w0, wall", start, None)
        share = (isolated[0] - in_process[0]) / start[0]
        print(f"{'isolation share of run start (p50)':<44} {share:8.1%}")
    finally:
        host.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--files", default="1,10,50", help="comma-separated file counts")
    arguments = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} (cores: {os.cpu_count()})")
    for count in (int(count) for count in arguments.files.split(",")):
        _bench(count, arguments.runs)
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
