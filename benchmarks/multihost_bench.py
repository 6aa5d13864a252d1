"""Several hosts on one PostgreSQL database (issue 14): throughput, claims, takeover.

    python benchmarks/multihost_bench.py --admin-url postgresql://postgres@127.0.0.1:5432/postgres
        [--runs 150] [--rounds 3] [--claims 600] [--only throughput,claims,takeover]

`--admin-url` names a PostgreSQL server where the benchmark may create databases (one
per measurement). Measures:
  1. runs/s of a 3-node workflow with 1, 2 and 3 hosts (three homes) on one database,
     beside one host on SQLite: N runs submitted round-robin, until all completed; the
     median of the rounds (the cases take turns within a round, so a change in the
     machine's load spreads over all of them), with the load average around each;
  2. claim latency (candidate query + compare-and-set claim, one transaction) with 3
     processes claiming from one queue at once: p50, p99 and lost races;
  3. takeover time: a host is SIGKILLed while it runs a workflow; time until another host
     (default timers: 15 s lease, 5 s heartbeat, 2 s poll) holds the run's claim.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg2
from host_bench import percentile, queue_runs
from private_host import start_host

from pi_workflows.client import WorkflowClient
from pi_workflows.client.start_request import start_payload
from pi_workflows.home import Home

CHAIN = """
from pi_workflows import compute, edge, workflow

WORKFLOW = workflow(
    name="chain",
    start_at="a",
    nodes={
        "a": compute(lambda ctx: {"n": ctx.input["n"]}),
        "b": compute(lambda ctx: {"n": ctx.outputs["a"]["n"] + 1}),
        "c": compute(lambda ctx: {"n": ctx.outputs["b"]["n"] + 1}),
    },
    edges=[edge("a", "b"), edge("b", "c")],
)
"""

# b waits for <project>/release so a host can be killed while it runs the workflow.
HELD = """
import time
from pathlib import Path

from pi_workflows import compute, edge, workflow


def hold(ctx):
    while not (Path.cwd() / "release").exists():
        time.sleep(0.05)
    return {"held": True}


WORKFLOW = workflow(
    name="held",
    start_at="a",
    nodes={"a": compute(lambda ctx: {}), "b": compute(hold)},
    edges=[edge("a", "b")],
)
"""


class Server:
    """One autocommit admin connection that creates and drops a database per measurement."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.admin = psycopg2.connect(admin_url)
        self.admin.autocommit = True

    def create(self) -> str:
        name = f"piw_bench_{uuid.uuid4().hex[:10]}"
        with self.admin.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')
        return self.admin_url.rsplit("/", 1)[0] + "/" + name

    def drop(self, url: str) -> None:
        with self.admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


def _scalar(url: str | None, home: Home, sql: str, *params: object) -> object:
    if url is None:
        import sqlite3

        connection = sqlite3.connect(f"file:{home.database_path}?mode=ro", uri=True, timeout=5)
        try:
            return connection.execute(sql.replace("%s", "?"), params).fetchone()[0]
        finally:
            connection.close()
    connection = psycopg2.connect(url)
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()[0]
    finally:
        connection.close()


def _homes(root: Path, count: int, url: str | None, env: dict[str, str]) -> list[tuple]:
    started = []
    for index in range(count):
        home = Home(root / f"h{index}")
        host_env = dict(env)
        if url is not None:
            host_env["PI_WORKFLOWS_DATABASE"] = url
        started.append((home, start_host(home, host_env)))
    return started


def _stop(hosts: list[tuple]) -> None:
    for _, process in hosts:
        if process.poll() is None:
            process.terminate()
    for _, process in hosts:
        process.wait(timeout=60)


def bench_throughput(root: Path, url: str | None, count: int, runs: int, env: dict) -> float:
    project = root / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "chain.workflow.py").write_text(CHAIN)
    payload = start_payload("chain", project)
    hosts = _homes(root, count, url, env)
    clients = [WorkflowClient(home, autostart=False) for home, _ in hosts]
    try:
        began = time.perf_counter()
        for n in range(runs):
            clients[n % count].start_run({**payload, "input": {"n": n}})
        sql = "SELECT COUNT(*) FROM runs WHERE status = 'completed'"
        # Each look opens a connection: a quarter second apart, they cost the hosts
        # nothing measurable and round the time up by at most that.
        while _scalar(url, hosts[0][0], sql) < runs:
            time.sleep(0.25)
        return runs / (time.perf_counter() - began)
    finally:
        for client in clients:
            client.close()
        _stop(hosts)


def _claim_loop(url: str, owner: str, results: multiprocessing.Queue) -> None:
    from pi_workflows.storage import open_state, run_claims

    root = Path(tempfile.mkdtemp(prefix="piw-claimer-"))
    store = open_state(Home(root / "home"), url)
    latencies, lost = [], 0
    try:
        while True:
            began = time.perf_counter()
            # As a host's claim pass does: candidates and claim in one transaction.
            with store.transaction():
                candidates = run_claims.claim_candidates(owner, set(), limit=1)
                if candidates:
                    token = run_claims.new_claim_token()
                    claim = run_claims.claim_run(candidates[0], owner, token)
            if not candidates:
                break
            latencies.append((time.perf_counter() - began) * 1000)
            lost += claim is None
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    results.put((latencies, lost))


def bench_claims(url: str, queued: int, claimers: int = 3) -> tuple[list[float], int]:
    from pi_workflows.storage import open_state

    root = Path(tempfile.mkdtemp(prefix="piw-claims-"))
    store = open_state(Home(root / "home"), url)
    try:
        with store.transaction():
            queue_runs(queued, root)
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [
        context.Process(target=_claim_loop, args=(url, f"claimer-{i}", results))
        for i in range(claimers)
    ]
    for process in processes:
        process.start()
    latencies, lost = [], 0
    for _ in processes:
        own, own_lost = results.get(timeout=600)
        latencies += own
        lost += own_lost
    for process in processes:
        process.join()
    return latencies, lost


def bench_takeover(root: Path, url: str, env: dict[str, str]) -> float:
    project = root / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "held.workflow.py").write_text(HELD)
    [(home_a, host_a)] = _homes(root / "a", 1, url, env)
    client = WorkflowClient(home_a, autostart=False)
    run_id = client.start_run(start_payload("held", project))["runId"]
    client.close()
    sql = "SELECT COUNT(*) FROM node_attempts WHERE run_id = %s AND node_id = 'b'"
    while not _scalar(url, home_a, sql, run_id):
        time.sleep(0.05)
    [(home_b, host_b)] = _homes(root / "b", 1, url, env)
    owner_sql = "SELECT owner_id FROM leases WHERE run_id = %s"
    victim = _scalar(url, home_a, owner_sql, run_id)
    host_a.send_signal(signal.SIGKILL)
    host_a.wait()
    killed = time.perf_counter()
    while _scalar(url, home_a, owner_sql, run_id) in (victim, None):
        time.sleep(0.02)
    takeover_s = time.perf_counter() - killed
    (project / "release").touch()
    done = "SELECT COUNT(*) FROM runs WHERE run_id = %s AND status = 'completed'"
    while not _scalar(url, home_a, done, run_id):
        time.sleep(0.05)
    _stop([(home_b, host_b)])
    return takeover_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin-url", required=True)
    parser.add_argument("--runs", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--claims", type=int, default=600)
    parser.add_argument(
        "--only",
        default="throughput,claims,takeover",
        help="comma-separated parts to measure (default: all three)",
    )
    args = parser.parse_args()
    parts = set(args.only.split(","))
    server = Server(args.admin_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PI_WORKFLOWS_")}

    def scratch() -> Path:
        root = Path(tempfile.mkdtemp(prefix="piw-mhb-", dir="/tmp"))
        os.chmod(root, 0o700)
        env["PI_WORKFLOWS_CONFIG_DIR"] = str(root / "config")
        return root

    if "throughput" in parts:
        bench_throughput_part(server, scratch, env, args.runs, args.rounds)
    if "claims" in parts:
        bench_claims_part(server, args.claims)
    if "takeover" in parts:
        bench_takeover_part(server, scratch, env)


def bench_throughput_part(
    server: Server, scratch: Callable[[], Path], env: dict[str, str], runs: int, rounds: int
) -> None:
    cases = [("SQLite", 1, False)] + [("PostgreSQL", count, True) for count in (1, 2, 3)]
    rates: dict[tuple[str, int], list[float]] = {(label, count): [] for label, count, _ in cases}
    for round_number in range(1, rounds + 1):
        for label, count, on_postgres in cases:
            root = scratch()
            url = server.create() if on_postgres else None
            load_before = os.getloadavg()[0]
            try:
                rate = bench_throughput(root, url, count, runs, env)
            finally:
                if url:
                    server.drop(url)
                shutil.rmtree(root, ignore_errors=True)
            rates[(label, count)].append(rate)
            print(
                f"round {round_number}: {label}, {count} host(s): {rate:.2f} runs/s "
                f"(load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after)",
                flush=True,
            )
    print(f"{runs} 3-node runs per round, median of {rounds} round(s):")
    for (label, count), measured in rates.items():
        print(
            f"  {label}, {count} host(s): {statistics.median(measured):.2f} runs/s "
            f"(rounds: {', '.join(f'{rate:.2f}' for rate in measured)})"
        )


def bench_claims_part(server: Server, claims: int) -> None:
    url = server.create()
    try:
        latencies, lost = bench_claims(url, claims)
    finally:
        server.drop(url)
    print(
        f"claim latency, 3 claimers on one queue of {claims}: "
        f"p50 {percentile(latencies, 0.5):.2f} ms, p99 {percentile(latencies, 0.99):.2f} ms, "
        f"{lost} lost compare-and-set races of {len(latencies)} attempts"
    )


def bench_takeover_part(server: Server, scratch: Callable[[], Path], env: dict[str, str]) -> None:
    root, url = scratch(), server.create()
    try:
        takeover_s = bench_takeover(root, url, env)
    finally:
        server.drop(url)
        shutil.rmtree(root, ignore_errors=True)
    print(f"takeover after SIGKILL of the owning host (15 s lease): {takeover_s:.1f} s")


if __name__ == "__main__":
    main()
