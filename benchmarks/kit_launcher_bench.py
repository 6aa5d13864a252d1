"""What a test's host and command cost, exec'd and forked from the test kit's launcher.

    python benchmarks/kit_launcher_bench.py [--rounds 15]

The test kit forks hosts and commands from one warm process (`pi_workflows.testing.
launcher`) instead of exec'ing a new interpreter for each. For each way this runs a
command (`run list` against a live host, which has to answer it) and a host started and
stopped with SIGTERM (no run, so no worker fork server), alternating the two ways, and
prints the median and p95 of each one's CPU (user + system, in the kernel's 10 ms ticks:
read as a median over many rounds) and wall time. An exec'd child's CPU is this process's
children's; a forked one's is the launcher's children's.

A third case is an in-process host (the installed plugins enabled, as the host tests
have them) running one `hello` run: its worker fork server is a new interpreter when
commands are exec'd and a child forked by the launcher otherwise; what is measured is
that fork server's CPU with its worker's (the host itself runs in this process either way).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from collections.abc import Callable

import psutil
from host_bench import percentile

from pi_workflows.testing import (
    InProcessHost,
    WorkflowHost,
    installed_entry_points,
    launcher,
    short_temp_dir,
)

Sample = tuple[float, float]  # CPU ms, wall ms


def own_children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def launcher_children_cpu() -> float:
    # A forked child's exit is reported once the launcher reaped it, so by the time its
    # wait() returns its CPU is in the launcher's children's.
    shared = launcher.shared_launcher()
    assert shared is not None
    times = psutil.Process(shared.process.pid).cpu_times()
    return times.children_user + times.children_system


def measure(action: Callable[[], object], cpu: Callable[[], float]) -> Sample:
    cpu_before, began = cpu(), time.perf_counter()
    action()
    wall = time.perf_counter() - began
    return (cpu() - cpu_before) * 1000, wall * 1000


def host_cycle(host: WorkflowHost) -> None:
    host.start()
    host.stop()


def in_process_run() -> None:
    host = InProcessHost(short_temp_dir())
    try:
        host.use_entry_points(*installed_entry_points())
        host.start()
        host.wait_for_run(host.start_run("hello", {"name": "bench"}))
        host.stop()  # its fork server ends (and is reaped) before this returns
    finally:
        host.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    samples: dict[str, list[Sample]] = {}
    served = WorkflowHost(short_temp_dir())  # the host the commands ask
    cycled = WorkflowHost(short_temp_dir())
    try:
        served.start()
        for _ in range(args.rounds):
            for way in ("exec", "fork"):
                if way == "exec":
                    os.environ[launcher.MODE_ENV] = "exec"
                    cpu = own_children_cpu
                else:
                    os.environ.pop(launcher.MODE_ENV, None)
                    launcher.shared_launcher()
                    cpu = launcher_children_cpu
                samples.setdefault(f"command `run list`, {way}", []).append(
                    measure(lambda: served.cli("run", "list"), cpu)
                )
                samples.setdefault(f"host start + stop, {way}", []).append(
                    measure(lambda: host_cycle(cycled), cpu)
                )
                samples.setdefault(f"in-process host's fork server, {way}", []).append(
                    measure(in_process_run, cpu)
                )
    finally:
        os.environ.pop(launcher.MODE_ENV, None)
        served.cleanup()
        cycled.cleanup()
    print(f"{'':36} {'CPU median':>11} {'CPU p95':>9} {'wall median':>12} {'wall p95':>9}")
    for name, values in samples.items():
        cpu_ms, wall_ms = [v[0] for v in values], [v[1] for v in values]
        print(
            f"{name:36} {statistics.median(cpu_ms):9.0f}ms {percentile(cpu_ms, 0.95):7.0f}ms "
            f"{statistics.median(wall_ms):10.0f}ms {percentile(wall_ms, 0.95):7.0f}ms"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f} (2 cores: {os.cpu_count()})")


if __name__ == "__main__":
    main()
