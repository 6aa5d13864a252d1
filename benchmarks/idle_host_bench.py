"""What a host doing nothing costs: CPU per second of the host, and of its PostgreSQL backend.

    python benchmarks/idle_host_bench.py [--windows 6] [--polls 0.2,2] [--backend both]

A host with no run polls for due work every `PI_WORKFLOWS_POLL_S` (2 s by default; the
test kit's hosts poll every 0.2 s, and a test suite keeps hundreds of them up). For each
poll period and backend this starts a private host as a user runs it, then samples the CPU
(user + system) of the host process, and of the PostgreSQL backends serving it, every 5 s
(the kernel counts CPU in 10 ms ticks, too coarse for one second): it prints the median and
p95 of those windows in milliseconds of CPU per second, leaving out the first, which holds
what remains of the host's start.
The PostgreSQL server is the test kit's (`PostgresCluster`), started here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import psutil
from host_bench import percentile
from private_host import private_host

from pi_workflows.testing.postgres import PostgresCluster


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue  # a backend that ended: its last second is lost, not misread
        total += times.user + times.system
    return total


def backends_of(cluster: PostgresCluster, database: str) -> list[psutil.Process]:
    """The server's backend processes connected to `database` (its process titles)."""
    postmaster = psutil.Process(int((cluster.data_dir / "postmaster.pid").read_text().split()[0]))
    found = []
    for child in postmaster.children():
        try:
            if f" {database} " in " ".join(child.cmdline()) + " ":
                found.append(child)
        except psutil.Error:
            continue
    return found


WINDOW_S = 5.0


def sample(
    host: psutil.Process, backends: list[psutil.Process], windows: int
) -> tuple[list[float], list[float]]:
    """Milliseconds of CPU per second in each window: (host, backends)."""
    host_ms, backend_ms = [], []
    last_host, last_backends = cpu_seconds([host]), cpu_seconds(backends)
    for _ in range(windows):
        time.sleep(WINDOW_S)
        now_host, now_backends = cpu_seconds([host]), cpu_seconds(backends)
        host_ms.append((now_host - last_host) * 1000 / WINDOW_S)
        backend_ms.append((now_backends - last_backends) * 1000 / WINDOW_S)
        last_host, last_backends = now_host, now_backends
    return host_ms, backend_ms


def figures(label: str, values: list[float]) -> str:
    return f"{label} {statistics.median(values):.1f} ms/s (p95 {percentile(values, 0.95):.1f})"


def measure(poll: str, cluster: PostgresCluster | None, windows: int) -> str:
    extra = {"PI_WORKFLOWS_POLL_S": poll}
    url = database = None
    if cluster is not None:
        url = cluster.server.create_database()
        database = url.rsplit("/", 1)[1]
        extra["PI_WORKFLOWS_DATABASE"] = url
    try:
        with private_host("piw-idle-", **extra) as bench:
            backends = backends_of(cluster, database) if cluster and database else []
            host = psutil.Process(bench.process.pid)
            host_ms, backend_ms = sample(host, backends, windows + 1)
            host_ms, backend_ms = host_ms[1:], backend_ms[1:]  # the start's remains
    finally:
        if cluster is not None and url is not None:
            cluster.server.drop_database(url)
    line = figures("host", host_ms)
    if cluster is not None:
        line += ", " + figures(f"PostgreSQL ({len(backends)} backend(s))", backend_ms)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, default=6, help="5-second samples per case")
    parser.add_argument("--polls", default="0.2,2", help="poll periods to try, in seconds")
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    args = parser.parse_args()
    polls = [poll.strip() for poll in args.polls.split(",") if poll.strip()]
    cluster = PostgresCluster() if args.backend != "sqlite" else None
    try:
        print(
            f"load average {os.getloadavg()[0]:.1f}; "
            f"{args.windows} samples of {WINDOW_S:.0f} s each"
        )
        for poll in polls:
            if args.backend != "postgresql":
                print(f"SQLite, poll {poll} s: {measure(poll, None, args.windows)}", flush=True)
            if cluster is not None:
                print(
                    f"PostgreSQL, poll {poll} s: {measure(poll, cluster, args.windows)}", flush=True
                )
    finally:
        if cluster is not None:
            cluster.destroy()


if __name__ == "__main__":
    main()
