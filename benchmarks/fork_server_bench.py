"""What the worker fork server and its workers cost per run, on a `host run` process.

    python benchmarks/fork_server_bench.py [--rounds 3] [--runs 300]

Starts a host as `pi-workflows host run` starts it (a new interpreter, SQLite, the
benchmark's 3-node workflow of `compare_dbos.py`), runs a few runs to start the fork
server, then `--runs` sequential runs per round, and prints per run, median over the
rounds: the fork server's own CPU (its forks), its workers' CPU (user and system, from
the fork server's reaped children) and minor page faults, and the fork server's resident
memory. The kernel counts CPU in 10 ms ticks: read the figures over hundreds of runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import dataclass, fields

import compare_dbos
import psutil

from pi_workflows.testing import wait_until

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


@dataclass
class Cost:
    """Per run, from the fork server's /proc counters."""

    fork_server_ms: float = 0.0
    worker_user_ms: float = 0.0
    worker_system_ms: float = 0.0
    worker_faults: float = 0.0
    fork_server_rss_mb: float = 0.0


def _counters(pid: int) -> tuple[int, ...]:
    """minflt, cminflt, utime, stime, cutime, cstime (ticks) of `pid`."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        after_name = stat.read().rsplit(")", 1)[1].split()
    return tuple(int(after_name[i]) for i in (7, 8, 11, 12, 13, 14))


def one_round(runs: int) -> Cost:
    host = compare_dbos.PiHost()
    try:
        for _ in range(5):  # the fork server starts serving, and its spare is forked
            host.wait(host.client.start_run(host.payloads["three"])["runId"])
        (fork_server,) = psutil.Process(host.process.pid).children()
        before = _counters(fork_server.pid)
        for _ in range(runs):
            host.wait(host.client.start_run(host.payloads["three"])["runId"])
        # A worker's counters join its fork server's once it is reaped: wait until only
        # the spare is left.
        wait_until(lambda: len(fork_server.children()) <= 1, timeout=10, what="the workers reaped")
        after = _counters(fork_server.pid)
        _, faults, user, system, child_user, child_system = (
            (b - a) / runs for a, b in zip(before, after, strict=True)
        )
        return Cost(
            fork_server_ms=(user + system) * TICK_MS,
            worker_user_ms=child_user * TICK_MS,
            worker_system_ms=child_system * TICK_MS,
            worker_faults=faults,
            fork_server_rss_mb=fork_server.memory_info().rss / 2**20,
        )
    finally:
        host.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    print(f"load: {compare_dbos.load()}")
    costs = [one_round(args.runs) for _ in range(args.rounds)]
    for field in fields(Cost):
        values = [getattr(cost, field.name) for cost in costs]
        shown = ", ".join(f"{value:.2f}" for value in values)
        print(f"{field.name:20} median {statistics.median(values):8.2f}   rounds: {shown}")
    print(f"load: {compare_dbos.load()}")


if __name__ == "__main__":
    main()
