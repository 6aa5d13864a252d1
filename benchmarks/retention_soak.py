"""Retention soak (issue 26): many small runs through one host that prunes as it goes.

    python benchmarks/retention_soak.py [--waves 20] [--per-wave 250] [--kept 20000]

Starts a private host in a temporary home with `retention` 1 minute and a sweep every 5 s,
then sends waves of headless `hello` runs (started with `run.startBatch`, waited for; the
host sweeps in the idle moment after each wave). After every wave it prints the runs the
database holds, its size (pages in use and the file), and the host's RSS. Then it inserts
`--kept` finished runs the sweep keeps (recent) and measures `run list --limit 50` (first
page and a deep page) and `run status` round trips with that many runs kept.

Prints figures only; docs/operations.md records them.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import time
from pathlib import Path

import psutil
from host_bench import percentile
from private_host import private_host
from timing import timed_samples

from pi_workflows.client import WorkflowClient
from pi_workflows.client.start_request import start_payload
from pi_workflows.clock import now_ms
from pi_workflows.home import Home
from pi_workflows.testing.seeding import seed_finished_runs


def database_figures(home: Home) -> tuple[int, int, int]:
    """(runs, bytes of pages in use, bytes of the file and its WAL)."""
    path = home.root / "state.sqlite"
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        runs = connection.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
        pages = connection.execute("PRAGMA page_count").fetchone()[0]
        free = connection.execute("PRAGMA freelist_count").fetchone()[0]
    finally:
        connection.close()
    on_disk = sum(p.stat().st_size for p in path.parent.glob("state.sqlite*") if p.is_file())
    return runs, (pages - free) * page_size, on_disk


def wave(client: WorkflowClient, project: Path, count: int, index: int) -> None:
    payloads = [start_payload("hello", project, {"name": f"w{index}-{n}"}) for n in range(count)]
    started = client.start_runs(payloads)
    for run in started:
        status = client.wait_for_run(run["runId"], poll_s=0.05)
        assert status["status"] == "completed", status


def wait_for_sweep(client: WorkflowClient, after_ms: int, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        last = client.host_status().get("lastPrune")
        if last and last["at"] >= after_ms:
            return last
        time.sleep(0.2)
    raise SystemExit("no sweep after the wave")


def keep_runs(home: Home, project: Path, count: int) -> None:
    """`count` completed runs written beside the live host, 1,000 per transaction; finished
    an hour ahead, so the 1-minute retention does not reach them while the measurement
    runs."""
    seed_finished_runs(
        home,
        project,
        count,
        first_created_at=now_ms() + 3_600_000,
        prefix="kept",
        per_transaction=1000,
    )


def prune_steps(home: Home, project: Path) -> str:
    """How long each prune step holds the write lock with the kept runs beside 1,000
    expired ones (in this process, the host stopped: the steps its `state.prune` runs)."""
    from pi_workflows.storage import open_state
    from pi_workflows.storage.retention import DAY_MS, PruneReport, prune_batches

    seed_finished_runs(
        home,
        project,
        1000,
        first_created_at=now_ms() - 40 * DAY_MS,
        prefix="expired",
        per_transaction=1000,
    )
    store = open_state(home)
    try:
        report = PruneReport(before=now_ms() - 30 * DAY_MS, applied=True)
        steps = prune_batches(store, report)
        began = time.perf_counter()
        next(steps)  # the plan (read without the lock) and the first step
        first = (time.perf_counter() - began) * 1000
        samples = timed_samples(lambda: next(steps, None), 10)
    finally:
        store.close()
    return (
        f"state prune --apply of 1,000 expired runs beside them: the plan and first step "
        f"{first:.0f} ms, then a step (50 lineages, one write transaction) p50 "
        f"{percentile(samples, 0.5):.0f} ms, max {max(samples):.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waves", type=int, default=20)
    parser.add_argument("--per-wave", type=int, default=250)
    parser.add_argument("--kept", type=int, default=20_000)
    args = parser.parse_args()

    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    rss: list[int] = []
    with private_host(
        "piw-soak-", PI_WORKFLOWS_RETENTION="1m", PI_WORKFLOWS_RETENTION_SWEEP_S="5"
    ) as bench:
        home, project, client = bench.home, bench.project, bench.client
        process = psutil.Process(bench.process.pid)
        began = time.monotonic()
        for index in range(args.waves):
            wave_began = int(time.time() * 1000)
            wave(client, project, args.per_wave, index)
            last = wait_for_sweep(client, wave_began)
            runs, used, on_disk = database_figures(home)
            rss.append(process.memory_info().rss)
            print(
                f"wave {index + 1:3d}: {(index + 1) * args.per_wave:6d} runs done, "
                f"{runs:5d} in the database, {used / 2**20:6.1f} MiB used, "
                f"{on_disk / 2**20:6.1f} MiB on disk, host RSS {rss[-1] / 2**20:6.1f} MiB, "
                f"last sweep pruned {last.get('runs', 0)} runs in {last.get('durationMs', 0)} ms "
                f"({last['outcome']})"
            )
        elapsed = time.monotonic() - began
        total = args.waves * args.per_wave
        print(f"{total} runs in {elapsed:.0f} s ({total / elapsed:.1f} runs/s)")
        # The first part: the database fills to its retention and the sweeps begin.
        first_part = max(1, len(rss) // 3)
        baseline, later = rss[first_part - 1], rss[first_part:] or rss[-1:]
        print(
            f"host RSS: {baseline / 2**20:.1f} MiB after the first third of the waves, "
            f"at most {max(later) / 2**20:.1f} MiB after it "
            f"({(max(later) / baseline - 1) * 100:+.1f} %), last {rss[-1] / 2**20:.1f} MiB"
        )
        keep_runs(home, project, args.kept)
        runs, used, _ = database_figures(home)
        listing = timed_samples(lambda: client.list_runs(50), 50)
        deep = f"kept-{args.kept // 2:06d}"
        paging = timed_samples(lambda: client.list_runs(50, before=deep), 50)
        status = timed_samples(lambda: client.run_status(deep), 200)
        print(
            f"with {runs} runs kept ({used / 2**20:.1f} MiB): run list --limit 50 p50 "
            f"{percentile(listing, 0.5):.1f} ms, deep page p50 {percentile(paging, 0.5):.1f} ms, "
            f"run status p50 {percentile(status, 0.5):.2f} ms"
        )
        # Stopped first: its own sweep (every 5 s, 1-minute retention) would prune the
        # expired runs under the measurement.
        bench.process.terminate()
        bench.process.wait(timeout=30)
        print(prune_steps(home, project))
        print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
