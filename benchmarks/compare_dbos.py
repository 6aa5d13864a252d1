"""pi-workflows and DBOS Transact side by side, same workloads, same machine, one run.

    python benchmarks/compare_dbos.py [--rounds 3] [--runs 30] [--queued 300]
                                      [--answers 15] [--sync-runs 50] [--skip-dbos]
                                      [--backend sqlite|postgresql] [--statements]
                                      [--round-trips]

Installs DBOS from benchmarks/requirements.txt into its own virtual environment (under
the user cache directory, reused while the requirements do not change) and runs its half
of each workload there (benchmarks/dbos_workloads.py; SQLite system database, queue and
notification polling every 10 ms). pi-workflows runs as a user runs it: a private host
process (default timers, WAL with synchronous=FULL) with one supervised worker process
per run, driven over its socket by the client library and the CLI; its modules and its
plugins' are compiled first, as an install compiles them.

With `--backend postgresql` both systems keep their state in one throwaway PostgreSQL 15
server the benchmark starts (the test kit's PostgresCluster; fsync on, as in production;
pg_stat_statements loaded), each run of a workload in a fresh database of its own.
Besides the timings it reports, per run, the statements each system sent and the
transactions it committed (pg_stat_statements calls and pg_stat_database xact_commit of
that database), the server's time executing them (pg_stat_statements total_exec_time,
the commits' WAL flushes included) and planning them (total_plan_time), each over the
system's whole life, read after it
has exited: start-up and shut-down included, spread over the runs. `--statements`
prints pi-workflows' most frequent statements of the 4-worker queue workload and of the
one- and two-host ones (the benchmark's own completion poll among them). `--round-trips`
also counts the query texts each system sent (the server logs every one: a text may
hold several statements, which pg_stat_statements counts apart), at the cost of that
logging in the timings. The fsync row is left out (the server, not the systems, syncs).

Workloads (every round runs both systems, one after the other):
  seq      3-node workflow (three compute steps), start -> result, sequential p50/p95;
  queue    300 queued 3-node runs: enqueue rate (starts/s) and end-to-end runs/s; the
           CPU of the whole process tree for them (pi-workflows: host, fork server and
           workers; DBOS: its process) and, for pi-workflows at 4 workers, of the host
           process alone (user + system, psutil); each run is waited for in turn, as
           DBOS waits on its handles; pi-workflows at PI_WORKFLOWS_MAX_WORKERS 1, 2, 4
           and 8 (how it scales with its workers);
           pi-workflows' starts also pipelined (one request per run, up to 32 sent ahead
           of their answers) and as one run.startBatch;
  hosts    (PostgreSQL, pi-workflows alone) the queued runs on one host with 4 workers,
           two hosts with 4 workers each and two with 2, each host in a home of its own
           on one shared database; runs are started through the hosts in turn, whichever
           host is free claims them, and completion is polled from the database (the
           poll's statements are taken off the counts); runs/s, CPU of both process trees
           per run, statements and commits per run, and how many runs each host ran;
  answer   a run waits (checkpoint / human decision; DBOS: recv) and the answer is
           timed until the continuation is done, p50;
  syncs    fsync/fdatasync calls per 3-node run under strace (pi-workflows: the host
           tree, which is the only writer; DBOS: its process); SQLite in WAL mode does
           one fdatasync per commit, DBOS's default rollback journal does several;
  cli      wall time of `--version` and of listing runs against a live system.

Prints a table of medians over the rounds with the ratio pi-workflows / DBOS (for rates,
DBOS / pi-workflows, so that > 1 always means pi-workflows is slower) and pi-workflows'
lowest and highest round, and the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import compileall
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import venv
from collections.abc import Callable
from importlib.metadata import entry_points
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import psutil
from platformdirs import user_cache_dir

from pi_workflows.client import WorkflowClient
from pi_workflows.client.start_request import start_payload
from pi_workflows.home import DATABASE_ENV, Home
from pi_workflows.testing.postgres import PostgresCluster

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"

THREE = """
from pi_workflows import compute, edge, workflow

WORKFLOW = workflow(
    name="three",
    start_at="a",
    nodes={
        "a": compute(lambda ctx: {"a": 1, "name": ctx.input.get("name")}),
        "b": compute(lambda ctx: {"b": 2, **ctx.outputs["a"]}),
        "c": compute(lambda ctx: {"sum": ctx.outputs["b"]["a"] + ctx.outputs["b"]["b"]}),
    },
    edges=[edge("a", "b"), edge("b", "c")],
)
"""

ASK = """
from pi_workflows import checkpoint, compute, edge, workflow

WORKFLOW = workflow(
    name="ask",
    start_at="a",
    nodes={
        "a": compute(lambda ctx: {"a": 1}),
        "ask": checkpoint(summary="go on?"),
        "c": compute(lambda ctx: {"sum": ctx.outputs["a"]["a"] + 1}),
    },
    edges=[edge("a", "ask"), edge("ask", "c")],
)
"""

DECIDE = """
from pi_workflows import choice, compute, edge, human_decision, workflow

WORKFLOW = workflow(
    name="decide",
    start_at="a",
    nodes={
        "a": compute(lambda ctx: {"a": 1}),
        "approve": human_decision(
            audience="operator",
            choices={"ship": choice("Ship")},
            request=lambda ctx: {"title": "Ship?", "presentation": {"blocks": []}},
        ),
        "c": compute(lambda ctx: {"sum": ctx.outputs["a"]["a"] + 1}),
    },
    edges=[edge("a", "approve"), edge("approve", "c")],
)
"""


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores)"


# --- the database server -----------------------------------------------------------


class Databases:
    """Where a system under test keeps its state: SQLite files (the default) or a fresh
    database per system on one PostgreSQL server, with what each system sent it."""

    def __init__(self, backend: str, round_trips: bool = False) -> None:
        self.cluster: PostgresCluster | None = None
        # The most frequent statements of the workloads that keep them, by workload.
        self.statements: dict[str, list[tuple[int, str]]] = {}
        self.round_trips = round_trips
        if backend == "postgresql":
            settings = {
                "shared_preload_libraries": "pg_stat_statements",
                "fsync": "on",
                # Planning counted apart from execution (`server planning per run`).
                "pg_stat_statements.track_planning": "on",
            }
            if round_trips:
                # One log line per query text the server receives (a round trip), named
                # by database; what it costs the server shows in the timings.
                settings |= {"log_statement": "all", "log_line_prefix": "%d:"}
            self.cluster = PostgresCluster(settings=settings)
            self.cluster.server.execute("CREATE EXTENSION pg_stat_statements")

    def fresh(self) -> str | None:
        """The URL of a new, empty PostgreSQL database; None for SQLite."""
        return None if self.cluster is None else self.cluster.server.create_database()

    def release(self, url: str | None, runs: int, keep_statements: str = "") -> dict[str, Any]:
        """Statements and commits per run on `url` once its system has exited; drops it."""
        if self.cluster is None or url is None:
            return {}
        server, name = self.cluster.server, url.rsplit("/", 1)[1]
        # A backend's counters reach pg_stat_database when it exits: wait for them all.
        deadline = time.monotonic() + 30
        while server.execute(f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{name}'")[0][
            0
        ]:
            if time.monotonic() > deadline:
                raise SystemExit(f"connections to {name} outlived their system")
            time.sleep(0.05)
        ((commits, statements, server_ms, planning_ms),) = server.execute(
            "SELECT d.xact_commit, (SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements s"
            " WHERE s.dbid = d.datid), (SELECT coalesce(sum(s.total_exec_time), 0) FROM"
            " pg_stat_statements s WHERE s.dbid = d.datid), (SELECT"
            " coalesce(sum(s.total_plan_time), 0) FROM pg_stat_statements s WHERE s.dbid ="
            f" d.datid) FROM pg_stat_database d WHERE d.datname = '{name}'"
        )
        if keep_statements:
            self.statements[keep_statements] = [
                (int(calls), str(query))
                for calls, query in server.execute(
                    "SELECT s.calls, s.query FROM pg_stat_statements s JOIN pg_database d"
                    f" ON d.oid = s.dbid WHERE d.datname = '{name}' ORDER BY s.calls DESC"
                    " LIMIT 25"
                )
            ]
        server.drop_database(url)
        counted = {}
        if self.round_trips:
            counted["round_trips_per_run"] = self._round_trips(name) / runs
        return counted | {
            "statements_per_run": int(statements) / runs,
            "commits_per_run": int(commits) / runs,
            # The server's time executing them (commits' WAL flushes included).
            "server_ms_per_run": float(server_ms) / runs,
            # The server's time planning them (a prepared statement's EXECUTE plans nothing).
            "planning_ms_per_run": float(planning_ms) / runs,
        }

    def _round_trips(self, name: str) -> int:
        """Query texts sent to database `name`: a simple query (``statement:``, however
        many statements its text holds) or an extended-protocol execute (``execute``)."""
        assert self.cluster is not None
        starts = (f"{name}:LOG:  statement: ", f"{name}:LOG:  execute ")
        with open(self.cluster.log_file, encoding="utf-8", errors="replace") as log:
            return sum(1 for line in log if line.startswith(starts))

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.destroy()


DATABASES = Databases("sqlite")


# --- DBOS ------------------------------------------------------------------------------


def dbos_python() -> Path:
    """The interpreter of DBOS's private environment, created on first use."""
    tag = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    where = Path(user_cache_dir("pi-workflows")) / f"bench-dbos-{tag}"
    python = where / "bin" / "python"
    # Written last: an install interrupted half-way is made again, not used.
    installed = where / "installed"
    if not installed.exists():
        print(f"installing DBOS into {where} ...", file=sys.stderr)
        shutil.rmtree(where, ignore_errors=True)
        venv.create(where, with_pip=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        installed.touch()
    return python


def dbos_run(python: Path, workload: str, runs: int) -> dict[str, Any]:
    url = DATABASES.fresh()
    database = [] if url is None else ["--database-url", url]
    with tempfile.TemporaryDirectory(prefix="dbos-bench-") as directory:
        done = subprocess.run(
            [str(python), str(HERE / "dbos_workloads.py"), workload, directory]
            + ["--runs", str(runs), *database],
            check=True,
            capture_output=True,
            text=True,
        )
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures | DATABASES.release(url, runs)


def dbos_syncs(python: Path, runs: int) -> float:
    with tempfile.TemporaryDirectory(prefix="dbos-bench-") as directory:
        process = subprocess.Popen(
            [
                str(python),
                str(HERE / "dbos_workloads.py"),
                "queue",
                directory,
                "--runs",
                str(runs),
                "--wait-for-go",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None and process.stdin is not None
        pid = int(process.stdout.readline().split()[1])
        with Strace(pid):
            process.stdin.write("go\n")
            process.stdin.flush()
            process.stdout.read()
        process.wait()
    return count_of(Strace.last) / runs


class Strace:
    """`strace -c -f` attached to a process tree for the duration of a `with` block."""

    last: Path

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.output = Path(tempfile.mkstemp(prefix="strace-")[1])

    def __enter__(self) -> Strace:
        self.process = subprocess.Popen(
            ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(self.output)]
            + ["-p", str(self.pid)],
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stderr is not None
        # strace names each thread it attaches on stderr: wait for the first one.
        line = self.process.stderr.readline()
        if "attached" not in line:
            raise SystemExit(f"strace could not attach: {line.strip()}")
        threading.Thread(target=self.process.stderr.read, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=30)
        Strace.last = self.output


def count_of(path: Path) -> int:
    total = 0
    for line in path.read_text().splitlines():
        fields = line.split()
        if fields and fields[-1] in ("fsync", "fdatasync"):
            total += int(fields[3])
    path.unlink(missing_ok=True)
    return total


# --- pi-workflows ----------------------------------------------------------------------


class PiHost:
    """A private home with the benchmark workflows and a host process serving it."""

    def __init__(self, max_workers: int = 4, shared_database: str | None = None) -> None:
        """With `shared_database` (PostgreSQL), serve that database beside the hosts
        already on it, in a home of its own; else a fresh database of its own."""
        self.shared = shared_database is not None
        self.database_url = shared_database if self.shared else DATABASES.fresh()
        self.root = Path(tempfile.mkdtemp(prefix="piw-compare-"))
        os.chmod(self.root, 0o700)
        self.home = Home(self.root / "home")
        self.project = self.root / "project"
        workflows = self.project / ".pi" / "workflows"
        workflows.mkdir(parents=True)
        for name, source in (("three", THREE), ("ask", ASK), ("decide", DECIDE)):
            (workflows / f"{name}.workflow.py").write_text(source)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PI_WORKFLOWS_")}
        self.env["PI_WORKFLOWS_CONFIG_DIR"] = str(self.root / "config")
        self.env["PI_WORKFLOWS_MAX_WORKERS"] = str(max_workers)
        if self.database_url is not None:
            self.env[DATABASE_ENV] = self.database_url
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pi_workflows", "--home", str(self.home.root), "host", "run"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                probe = WorkflowClient(self.home, autostart=False)
                probe.host_status()
                probe.close()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise SystemExit("the pi-workflows host did not start") from None
                time.sleep(0.05)
        self.client = WorkflowClient(self.home, autostart=False)
        self.payloads = {
            name: start_payload(name, self.project, {"name": "x"})
            for name in ("three", "ask", "decide")
        }

    def tree_cpu_s(self) -> float:
        """CPU of the host and every descendant, live or already reaped."""
        total = 0.0
        root = psutil.Process(self.process.pid)
        for process in [root, *root.children(recursive=True)]:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system + times.children_user + times.children_system
        return total

    def host_cpu_s(self) -> float:
        """User and system CPU of the host process alone (not its fork server or workers)."""
        times = psutil.Process(self.process.pid).cpu_times()
        return times.user + times.system

    def wait(self, run_id: str) -> dict[str, Any]:
        """As a user's code waits: on the status the host pushes."""
        return self.client.wait_for_run(run_id)

    def close(self, runs: int = 1, keep_statements: str = "") -> dict[str, Any]:
        """Stop the host; statements and commits per run of its database (PostgreSQL)."""
        self.client.close()
        self.process.terminate()
        self.process.wait(timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)
        if self.shared:  # released by whoever made it, once every host has stopped
            return {}
        return DATABASES.release(self.database_url, runs, keep_statements)


def pi_seq(runs: int) -> dict[str, Any]:
    host = PiHost()
    try:
        latencies = []
        for _ in range(runs):
            began = time.perf_counter()
            run_id = host.client.start_run(host.payloads["three"])["runId"]
            status = host.wait(run_id)
            assert status["status"] == "completed", status
            latencies.append((time.perf_counter() - began) * 1000)
    except BaseException:
        host.close()
        raise
    counters = host.close(runs)
    return {"p50_ms": percentile(latencies, 0.5), "p95_ms": percentile(latencies, 0.95)} | counters


def pi_batch_start(count: int) -> dict[str, Any]:
    """Starts per second when `count` runs are started by one `run.startBatch`."""
    host = PiHost()
    try:
        began = time.perf_counter()
        response = host.client.send("run.startBatch", {"runs": [host.payloads["three"]] * count})
        if not response.ok:
            return {}  # a host without the batch form
        assert len(response.receipt["runs"]) == count
        return {"starts_per_s": count / (time.perf_counter() - began)}
    finally:
        host.close()


def pi_pipelined_start(count: int) -> dict[str, Any]:
    """Starts per second when one client sends `count` `run.start` requests, one per run,
    up to 32 ahead of their answers (the host group-commits the ones that arrive
    together; each is answered after its commit). Workers run the runs meanwhile."""
    host = PiHost()
    try:
        began = time.perf_counter()
        responses = host.client.start_runs_pipelined([host.payloads["three"]] * count)
        assert all(response.ok for response in responses), responses[:3]
        return {"starts_per_s": count / (time.perf_counter() - began)}
    finally:
        host.close()


def pi_queue(count: int, max_workers: int) -> dict[str, Any]:
    host = PiHost(max_workers)
    try:
        cpu_before, host_cpu_before = host.tree_cpu_s(), host.host_cpu_s()
        began = time.perf_counter()
        run_ids = [host.client.start_run(host.payloads["three"])["runId"] for _ in range(count)]
        enqueued = time.perf_counter()
        # As DBOS's half waits on each handle in turn (polling `run list` would cost the
        # host more than the runs do).
        done = [host.wait(run_id) for run_id in run_ids]
        finished = time.perf_counter()
        assert all(r["status"] == "completed" for r in done), done[:3]
        figures = {
            "starts_per_s": count / (enqueued - began),
            "runs_per_s": count / (finished - began),
            "cpu_s": host.tree_cpu_s() - cpu_before,
            "host_cpu_s": host.host_cpu_s() - host_cpu_before,
        }
    except BaseException:
        host.close()
        raise
    kept = f"{count} queued runs, 4 workers" if max_workers == 4 else ""
    return figures | host.close(count, keep_statements=kept)


def pi_queue_hosts(count: int, hosts: int, max_workers: int) -> dict[str, Any]:
    """`count` queued runs on `hosts` hosts sharing one PostgreSQL database, each with
    `max_workers` workers; the runs are started through the hosts in turn and whichever
    host is free claims them. Completion is read from the database (a host pushes the
    status of the runs it runs, not of the ones another host ran)."""
    if DATABASES.cluster is None:
        return {}
    server, url = DATABASES.cluster.server, DATABASES.fresh()
    assert url is not None
    name = url.rsplit("/", 1)[1]
    started: list[PiHost] = []
    try:
        started.extend(PiHost(max_workers, shared_database=url) for _ in range(hosts))
        cpu_before = sum(host.tree_cpu_s() for host in started)
        began = time.perf_counter()
        for number in range(count):
            host = started[number % hosts]
            host.client.start_run(host.payloads["three"])
        enqueued = time.perf_counter()
        # One connection of our own polls; its statements and commits are taken off.
        import psycopg2

        watcher = psycopg2.connect(url)
        watcher.autocommit = True
        polls, done, deadline = 0, 0, time.monotonic() + 600
        with watcher, watcher.cursor() as cursor:
            while done < count:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{hosts} hosts finished {done} of {count} runs in 600 s")
                time.sleep(0.02)
                cursor.execute("SELECT count(*) FROM runs WHERE status IN ('completed', 'failed')")
                polls, done = polls + 1, cursor.fetchone()[0]
        watcher.close()
        finished = time.perf_counter()
        claimed = server.execute(
            "SELECT host_epoch, count(DISTINCT run_id) FROM run_workers GROUP BY 1", database=name
        )
        polls += 1  # that read
        figures = {
            "starts_per_s": count / (enqueued - began),
            "runs_per_s": count / (finished - began),
            "cpu_s": sum(host.tree_cpu_s() for host in started) - cpu_before,
            "runs_per_host": sorted(int(runs) for _, runs in claimed),
        }
    finally:
        for host in started:
            host.close()
    kept = f"{count} queued runs, {hosts} host(s) x {max_workers} workers"
    counters = DATABASES.release(url, count, keep_statements=kept)
    for key in ("statements_per_run", "commits_per_run"):
        counters[key] -= polls / count
    return figures | counters


def pi_answer(runs: int, kind: str) -> dict[str, Any]:
    host = PiHost()
    try:
        latencies = []
        for _ in range(runs):
            run_id = host.client.start_run(host.payloads[kind])["runId"]
            status = host.wait(run_id)
            assert status["status"] == "waiting", status
            if kind == "decide":
                decision = next(d for d in host.client.list_decisions() if d["runId"] == run_id)
            began = time.perf_counter()
            if kind == "ask":
                continuation = host.client.answer_checkpoint(run_id, {"go": True})["runId"]
            else:
                response = host.client.answer_decision(decision["decisionId"], "ship")
                assert response.ok, response
                continuation = response.receipt["continuationRunId"]
            status = host.wait(continuation)
            assert status["status"] == "completed", status
            latencies.append((time.perf_counter() - began) * 1000)
        return {"p50_ms": statistics.median(latencies), "p95_ms": percentile(latencies, 0.95)}
    finally:
        host.close()


def pi_syncs(runs: int) -> float:
    host = PiHost()
    try:
        with Strace(host.process.pid):
            run_ids = [host.client.start_run(host.payloads["three"])["runId"] for _ in range(runs)]
            for run_id in run_ids:
                host.wait(run_id)
        return count_of(Strace.last) / runs
    finally:
        host.close()


def cli_wall_ms(command: list[str], env: dict[str, str], repeats: int = 7) -> float:
    timings = []
    for _ in range(repeats):
        began = time.perf_counter()
        subprocess.run(command, env=env, check=True, capture_output=True)
        timings.append((time.perf_counter() - began) * 1000)
    return statistics.median(timings)


def pi_cli() -> dict[str, float]:
    host = PiHost()
    try:
        for _ in range(5):
            host.wait(host.client.start_run(host.payloads["three"])["runId"])
        cli = str(Path(sys.executable).parent / "pi-workflows")
        home = ["--home", str(host.home.root)]
        return {
            "version_ms": cli_wall_ms([cli, "--version"], host.env),
            "list_ms": cli_wall_ms([cli, *home, "--no-autostart", "run", "list"], host.env),
        }
    finally:
        host.close()


def dbos_cli(python: Path) -> dict[str, float]:
    database_url = DATABASES.fresh()
    database = [] if database_url is None else ["--database-url", database_url]
    with tempfile.TemporaryDirectory(prefix="dbos-bench-") as directory:
        subprocess.run(
            [str(python), str(HERE / "dbos_workloads.py"), "seq", directory, "--runs", "5"]
            + database,
            check=True,
            capture_output=True,
        )
        dbos = str(python.parent / "dbos")
        url = database_url or f"sqlite:///{directory}/dbos.sqlite"
        figures = {
            "version_ms": cli_wall_ms([dbos, "--help"], dict(os.environ)),
            "list_ms": cli_wall_ms([dbos, "workflow", "list", "-s", url], dict(os.environ)),
        }
    DATABASES.release(database_url, 1)
    return figures


# --- report ----------------------------------------------------------------------------

# (label, key, unit, higher is better)
ROWS = (
    ("3-node workflow start->result p50", "seq.p50_ms", "ms", False),
    ("3-node workflow start->result p95", "seq.p95_ms", "ms", False),
    ("{queued} queued runs, runs/s (1 worker)", "queue1.runs_per_s", "/s", True),
    ("{queued} queued runs, runs/s (2 workers)", "queue2.runs_per_s", "/s", True),
    ("{queued} queued runs, runs/s (4 workers)", "queue4.runs_per_s", "/s", True),
    ("{queued} queued runs, runs/s (8 workers)", "queue8.runs_per_s", "/s", True),
    ("enqueue, starts/s (one request per run)", "queue4.starts_per_s", "/s", True),
    ("enqueue, starts/s (pipelined, 1 request/run)", "pipelined.starts_per_s", "/s", True),
    ("enqueue, starts/s (run.startBatch of {queued})", "batch.starts_per_s", "/s", True),
    ("CPU of the process tree, {queued} runs", "queue4.cpu_s", "s", False),
    ("CPU per run", "queue4.cpu_per_run_ms", "ms", False),
    ("host CPU per run (host process alone)", "queue4.host_cpu_per_run_ms", "ms", False),
    ("checkpoint answer -> continuation done p50", "ask.p50_ms", "ms", False),
    ("decision answer -> continuation done p50", "decide.p50_ms", "ms", False),
    ("fsync+fdatasync per run", "syncs.per_run", "", False),
    ("round trips per run (3-node, sequential)", "seq.round_trips_per_run", "", False),
    ("round trips per run ({queued} queued)", "queue4.round_trips_per_run", "", False),
    ("statements per run (3-node, sequential)", "seq.statements_per_run", "", False),
    ("commits per run (3-node, sequential)", "seq.commits_per_run", "", False),
    ("statements per run ({queued} queued)", "queue4.statements_per_run", "", False),
    ("commits per run ({queued} queued)", "queue4.commits_per_run", "", False),
    ("server time per run ({queued} queued)", "queue4.server_ms_per_run", "ms", False),
    ("server planning per run ({queued} queued)", "queue4.planning_ms_per_run", "ms", False),
    ("{queued} queued runs, 1 host x 4 workers, runs/s", "hosts1x4.runs_per_s", "/s", True),
    ("{queued} queued runs, 2 hosts x 4 workers, runs/s", "hosts2x4.runs_per_s", "/s", True),
    ("{queued} queued runs, 2 hosts x 2 workers, runs/s", "hosts2x2.runs_per_s", "/s", True),
    ("CPU per run, 1 host x 4 workers", "hosts1x4.cpu_per_run_ms", "ms", False),
    ("CPU per run, 2 hosts x 4 workers", "hosts2x4.cpu_per_run_ms", "ms", False),
    ("statements per run, 1 host x 4 workers", "hosts1x4.statements_per_run", "", False),
    ("statements per run, 2 hosts x 4 workers", "hosts2x4.statements_per_run", "", False),
    ("commits per run, 2 hosts x 4 workers", "hosts2x4.commits_per_run", "", False),
    ("server time per run, 1 host x 4 workers", "hosts1x4.server_ms_per_run", "ms", False),
    ("server time per run, 2 hosts x 4 workers", "hosts2x4.server_ms_per_run", "ms", False),
    ("CLI --version wall", "cli.version_ms", "ms", False),
    ("CLI list runs wall (live system)", "cli.list_ms", "ms", False),
)


def lookup(figures: dict[str, Any], key: str) -> float | None:
    group, name = key.split(".")
    value = figures.get(group, {}).get(name)
    return None if value is None else float(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=30, help="sequential runs per round")
    parser.add_argument("--queued", type=int, default=300)
    parser.add_argument("--answers", type=int, default=15)
    parser.add_argument("--sync-runs", type=int, default=50)
    parser.add_argument("--skip-dbos", action="store_true", help="pi-workflows figures only")
    parser.add_argument(
        "--only", default="seq,queue,answer,syncs,cli", help="and `hosts` (PostgreSQL only)"
    )
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument(
        "--statements", action="store_true", help="print the host's most frequent statements"
    )
    parser.add_argument(
        "--round-trips",
        action="store_true",
        help="PostgreSQL: count the query texts each system sends (the server logs each one)",
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    if args.backend == "postgresql":
        only.discard("syncs")  # the server syncs, not the systems: nothing to compare
    else:
        only.discard("hosts")  # hosts share a database only on a server

    global DATABASES
    DATABASES = Databases(args.backend, round_trips=args.round_trips)
    try:
        measure(args, only)
    finally:
        DATABASES.close()


def compile_under_test() -> None:
    """Compile pi-workflows' modules and its installed plugins', as DBOS's install
    compiled its own: a copy under test run from its sources (PYTHONPATH, an editable
    install) where PYTHONDONTWRITEBYTECODE is set would compile every module each time a
    process starts, which a user's installed copy never does."""
    packages = {"pi_workflows"} | {
        entry.module.partition(".")[0] for entry in entry_points(group="pi_workflows")
    }
    for package in sorted(packages):
        spec = find_spec(package)
        if spec is not None:
            for location in spec.submodule_search_locations or []:
                compileall.compile_dir(location, quiet=1)


def measure(args: argparse.Namespace, only: set[str]) -> None:
    print(f"before: {load()} ({args.backend})", flush=True)
    compile_under_test()
    python = None if args.skip_dbos else dbos_python()
    rounds: dict[str, list[dict[str, Any]]] = {"dbos": [], "pi": []}
    steps: list[tuple[str, Callable[[], dict[str, Any]], Callable[[], dict[str, Any]]]] = []
    if "seq" in only:
        steps.append(("seq", lambda: dbos_run(python, "seq", args.runs), lambda: pi_seq(args.runs)))
    if "queue" in only:
        steps.append(
            (
                "queue4",
                lambda: dbos_run(python, "queue", args.queued),
                lambda: pi_queue(args.queued, 4),
            )
        )
        # How throughput scales with PI_WORKFLOWS_MAX_WORKERS: DBOS has no worker count.
        steps.append(("queue1", lambda: {}, lambda: pi_queue(args.queued, 1)))
        steps.append(("queue2", lambda: {}, lambda: pi_queue(args.queued, 2)))
        steps.append(("queue8", lambda: {}, lambda: pi_queue(args.queued, 8)))
        steps.append(("pipelined", lambda: {}, lambda: pi_pipelined_start(args.queued)))
        steps.append(("batch", lambda: {}, lambda: pi_batch_start(args.queued)))
    if "hosts" in only:
        # One and two hosts on one database, measured the same way (PostgreSQL only).
        for hosts, workers in ((1, 4), (2, 4), (2, 2)):
            steps.append(
                (
                    f"hosts{hosts}x{workers}",
                    lambda: {},
                    lambda h=hosts, w=workers: pi_queue_hosts(args.queued, h, w),
                )
            )
    if "answer" in only:
        steps.append(
            (
                "ask",
                lambda: dbos_run(python, "answer", args.answers),
                lambda: pi_answer(args.answers, "ask"),
            )
        )
        steps.append(
            (
                "decide",
                lambda: dbos_run(python, "answer", args.answers),
                lambda: pi_answer(args.answers, "decide"),
            )
        )
    if "syncs" in only:
        steps.append(
            (
                "syncs",
                lambda: {"per_run": dbos_syncs(python, args.sync_runs)},
                lambda: {"per_run": pi_syncs(args.sync_runs)},
            )
        )
    if "cli" in only:
        steps.append(("cli", lambda: dbos_cli(python), pi_cli))

    for number in range(args.rounds):
        figures: dict[str, dict[str, Any]] = {"dbos": {}, "pi": {}}
        for group, dbos_step, pi_step in steps:
            if python is not None:
                figures["dbos"][group] = dbos_step()
            figures["pi"][group] = pi_step()
        for side in figures.values():
            queue = side.get("queue4")
            if queue and "cpu_s" in queue:
                queue["cpu_per_run_ms"] = queue["cpu_s"] * 1000 / args.queued
            if queue and "host_cpu_s" in queue:
                queue["host_cpu_per_run_ms"] = queue["host_cpu_s"] * 1000 / args.queued
            for group in ("hosts1x4", "hosts2x4", "hosts2x2"):
                if side.get(group):
                    side[group]["cpu_per_run_ms"] = side[group]["cpu_s"] * 1000 / args.queued
        for group in ("hosts1x4", "hosts2x4", "hosts2x2"):
            if figures["pi"].get(group):
                split = figures["pi"][group]["runs_per_host"]
                print(f"{group}: runs per host {split}", file=sys.stderr)
        # DBOS has no worker count, batch or pipelined start: its one queue figure (its
        # enqueue calls, in-process, one after the other) stands for all.
        dbos_queue = figures["dbos"].get("queue4")
        if dbos_queue:
            figures["dbos"]["queue8"] = {"runs_per_s": dbos_queue.get("runs_per_s")}
            figures["dbos"]["batch"] = {"starts_per_s": dbos_queue.get("starts_per_s")}
            figures["dbos"]["pipelined"] = {"starts_per_s": dbos_queue.get("starts_per_s")}
        rounds["dbos"].append(figures["dbos"])
        rounds["pi"].append(figures["pi"])
        print(f"round {number + 1} done: {load()}", file=sys.stderr)

    print(f"{'workload':46} {'DBOS':>10} {'pi-workflows':>13} {'ratio':>7}  pi-workflows' rounds")
    for label, key, unit, higher_is_better in ROWS:
        values, spread = {}, ""
        for side in ("dbos", "pi"):
            found = [v for r in rounds[side] if (v := lookup(r, key)) is not None]
            values[side] = statistics.median(found) if found else None
            if side == "pi" and len(found) > 1:
                spread = f"{min(found):.1f} to {max(found):.1f}"
        dbos, pi = values["dbos"], values["pi"]
        if pi is None:
            continue
        ratio = ""
        if dbos:
            ratio = f"{(dbos / pi if higher_is_better else pi / dbos):.2f}x"
        shown = f"{dbos:.1f}{unit}" if dbos is not None else "-"
        label = label.format(queued=args.queued)
        print(f"{label:46} {shown:>10} {pi:>11.1f}{unit:2} {ratio:>7}  {spread}")
    print("ratio > 1: pi-workflows is slower (or uses more); < 1: faster")
    print(f"after: {load()}")
    for workload, statements in DATABASES.statements.items() if args.statements else ():
        print(f"\npi-workflows' most frequent statements, {workload} (last round):")
        for calls, query in statements:
            print(f"{calls / args.queued:8.2f}/run  {' '.join(query.split())[:110]}")


if __name__ == "__main__":
    main()
