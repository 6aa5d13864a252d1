"""The DBOS side of compare_dbos.py; runs inside DBOS's own virtual environment.

    python dbos_workloads.py WORKLOAD DIR [--runs N] [--wait-for-go] [--database-url URL]

WORKLOAD is `seq`, `queue` or `answer`. DBOS Transact runs in this process with a SQLite
system database in DIR (or the PostgreSQL database at URL), queue polling and (SQLite)
notification polling every 10 ms. Prints one
JSON object: the workload's figures plus `cpu_s`, the CPU time of this process (DBOS
runs its workflows in threads here, so that is the whole process tree). With
`--wait-for-go` it prints `READY <pid>` after launch and waits for a line on stdin, so
the caller can attach strace to the workload alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from dbos import DBOS, DBOSConfig

POLL_S = 0.01


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=("seq", "queue", "answer"))
    parser.add_argument("directory")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--wait-for-go", action="store_true")
    parser.add_argument("--database-url", help="a PostgreSQL system database instead")
    args = parser.parse_args()

    database_url = args.database_url or f"sqlite:///{Path(args.directory) / 'dbos.sqlite'}"
    config: DBOSConfig = {
        "name": "bench",
        "system_database_url": database_url,
        "notification_listener_polling_interval_sec": POLL_S,
        "log_level": "WARNING",
    }
    DBOS(config=config)

    @DBOS.step()
    def step_a(name: str) -> dict:
        return {"a": 1, "name": name}

    @DBOS.step()
    def step_b(previous: dict) -> dict:
        return {"b": 2, **previous}

    @DBOS.step()
    def step_c(previous: dict) -> dict:
        return {"sum": previous["a"] + previous["b"]}

    @DBOS.workflow()
    def three(name: str) -> dict:
        return step_c(step_b(step_a(name)))

    @DBOS.workflow()
    def ask(name: str) -> dict:
        first = step_a(name)
        DBOS.set_event("waiting", True)
        answer = DBOS.recv("answer", timeout_seconds=60)
        return step_c({"a": first["a"], "b": 1 if answer else 0})

    DBOS.launch()
    queue = DBOS.register_queue("bench", polling_interval_sec=POLL_S)
    if args.wait_for_go:
        print(f"READY {__import__('os').getpid()}", flush=True)
        sys.stdin.readline()

    began_cpu = time.process_time()
    result: dict = {}
    if args.workload == "seq":
        latencies = []
        for index in range(args.runs):
            began = time.perf_counter()
            handle = DBOS.start_workflow(three, f"n{index}")
            assert handle.get_result()["sum"] == 3
            latencies.append((time.perf_counter() - began) * 1000)
        result = {"p50_ms": percentile(latencies, 0.5), "p95_ms": percentile(latencies, 0.95)}
    elif args.workload == "queue":
        began = time.perf_counter()
        handles = [queue.enqueue(three, f"q{index}") for index in range(args.runs)]
        enqueued = time.perf_counter()
        for handle in handles:
            assert handle.get_result()["sum"] == 3
        finished = time.perf_counter()
        result = {
            "starts_per_s": args.runs / (enqueued - began),
            "runs_per_s": args.runs / (finished - began),
        }
    else:
        latencies = []
        for index in range(args.runs):
            handle = DBOS.start_workflow(ask, f"k{index}")
            DBOS.get_event(handle.workflow_id, "waiting", timeout_seconds=60)
            began = time.perf_counter()
            DBOS.send(handle.workflow_id, True, "answer")
            assert handle.get_result()["sum"] == 2
            latencies.append((time.perf_counter() - began) * 1000)
        result = {"p50_ms": statistics.median(latencies), "p95_ms": percentile(latencies, 0.95)}
    result["cpu_s"] = time.process_time() - began_cpu
    DBOS.destroy()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
