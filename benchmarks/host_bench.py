"""Host benchmarks (issue 4): prints latency, throughput and claim-cost figures.

    python benchmarks/host_bench.py [--runs 50] [--queued 200] [--clients 8]

Starts a private host in a temporary home (with the default 2 s poll timer, as a user
would run it), then measures:
  1. start → completed latency of `hello`, sequential runs (p50, p95);
  2. throughput of N queued headless `hello` runs (runs/s, end to end);
  3. `run.status` round trip with 8 concurrent clients (p50, p99);
  4. claim cost (candidate query + compare-and-set claim) with 100 vs 10,000 queued runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from private_host import private_host

from pi_workflows.client import WorkflowClient
from pi_workflows.client.start_request import start_payload as build_start_payload
from pi_workflows.home import Home


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def start_payload(project: Path, name: str) -> dict:
    return build_start_payload("hello", project, {"name": name})


def bench_latency(client: WorkflowClient, project: Path, runs: int) -> list[float]:
    latencies = []
    for index in range(runs):
        began = time.perf_counter()
        run_id = client.start_run(start_payload(project, f"n{index}"))["runId"]
        status = client.wait_for_run(run_id, poll_s=0.005)
        latencies.append((time.perf_counter() - began) * 1000)
        assert status["status"] == "completed", status
    return latencies


def bench_throughput(client: WorkflowClient, project: Path, count: int) -> float:
    payload = start_payload(project, "bulk")
    began = time.perf_counter()
    run_ids = [client.start_run(payload)["runId"] for _ in range(count)]
    for run_id in run_ids:
        client.wait_for_run(run_id, poll_s=0.05)
    return count / (time.perf_counter() - began)


def bench_status(home: Home, run_id: str, clients: int, per_client: int) -> list[float]:
    samples: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        client = WorkflowClient(home, autostart=False)
        local = []
        for _ in range(per_client):
            began = time.perf_counter()
            client.run_status(run_id)
            local.append((time.perf_counter() - began) * 1000)
        client.close()
        with lock:
            samples.extend(local)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return samples


def queue_runs(count: int, project: Path) -> None:
    """Insert `count` queued `hello` runs through the storage API (inside a transaction)."""
    from pi_workflows.storage.runs import create_run

    for index in range(count):
        create_run(
            run_id=f"run-{index:06d}",
            workflow_name="hello",
            workflow_ref="hello",
            workflow_source={"kind": "builtin", "id": "hello", "revision": "1"},
            definition_digest="0" * 64,
            project_path=str(project),
            input={},
            actor="bench",
        )


def bench_claim_cost(queued: int, repeats: int = 20) -> float:
    """Median ms of one claim (candidate query + claim) with `queued` runs waiting."""
    from pi_workflows.storage import open_state, run_claims

    root = Path(tempfile.mkdtemp(prefix="piw-claim-"))
    os.chmod(root, 0o700)
    store = open_state(Home(root))
    try:
        with store.transaction():
            queue_runs(queued, root)
        timings = []
        for _ in range(repeats):
            began = time.perf_counter()
            candidate = run_claims.claim_candidates("bench-host", set())[0]
            with store.transaction():
                run_claims.claim_run(candidate, "bench-host", run_claims.new_claim_token())
            timings.append((time.perf_counter() - began) * 1000)
        return statistics.median(timings)
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--queued", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()

    with private_host("piw-bench-") as bench:
        client = bench.client
        latencies = bench_latency(client, bench.project, args.runs)
        print(
            f"hello start->completed over {args.runs} sequential runs: "
            f"p50 {percentile(latencies, 0.5):.1f} ms, p95 {percentile(latencies, 0.95):.1f} ms"
        )
        throughput = bench_throughput(client, bench.project, args.queued)
        print(f"throughput of {args.queued} queued headless hello runs: {throughput:.1f} runs/s")
        run_id = client.list_runs(1)[0]["runId"]
        samples = bench_status(bench.home, run_id, args.clients, 200)
        print(
            f"run.status round trip, {args.clients} concurrent clients x 200: "
            f"p50 {percentile(samples, 0.5):.2f} ms, p99 {percentile(samples, 0.99):.2f} ms"
        )
    small, large = bench_claim_cost(100), bench_claim_cost(10_000)
    print(
        f"claim cost: {small:.2f} ms with 100 queued, {large:.2f} ms with 10,000 queued "
        f"(ratio {large / small:.2f})"
    )


if __name__ == "__main__":
    main()
