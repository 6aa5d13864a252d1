"""A throwaway PostgreSQL server for tests and benchmarks: initdb'd, started, restartable.

The tests' `postgres_server` fixtures and `benchmarks/compare_dbos.py --backend
postgresql` both start their server through :class:`PostgresCluster`. PostgreSQL refuses
to run as root, so as root its tools run as the `postgres` user.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .polling import wait_until
from .scratch import memory_dir

SCHEMA_TEMPLATE = "piw_schema_template"


class PostgresSetupError(RuntimeError):
    """The server binaries are missing or one of PostgreSQL's tools failed."""


@dataclass(frozen=True)
class PostgresServer:
    """A throwaway PostgreSQL cluster listening on localhost."""

    host: str
    port: int
    user: str
    password: str | None = None

    def url(self, database: str) -> str:
        login = f"{self.user}:{self.password}" if self.password else self.user
        return f"postgresql://{login}@{self.host}:{self.port}/{database}"

    def execute(self, statement: str, database: str = "postgres") -> list[tuple[object, ...]]:
        """Run one statement outside a transaction (CREATE DATABASE needs that); its rows."""
        import psycopg2

        connection = psycopg2.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            dbname=database,
        )
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute(statement)
                return list(cursor.fetchall()) if cursor.description else []
        finally:
            connection.close()

    def create_database(self, *, from_template: bool = False) -> str:
        """A new database, empty or a clone of the schema template; returns its URL.

        Cloning the template (SCHEMA_TEMPLATE, made once by whoever starts the server) is
        much faster than creating the schema in every test. FILE_COPY copies the template's
        files instead of writing each of its pages to the WAL (PostgreSQL 15's default):
        for databases this small, on a server without fsync, a third of the CPU (20 vs
        63 ms a database, measured on the postmaster's children).
        """
        name = f"piw_{uuid.uuid4().hex[:12]}"
        clause = f' TEMPLATE "{SCHEMA_TEMPLATE}"' if from_template else ""
        self.execute(f'CREATE DATABASE "{name}"{clause} STRATEGY FILE_COPY')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class PostgresCluster:
    """A PostgreSQL cluster of one test, session or benchmark, in a temporary directory.

    With a `password`, connections over TCP must give it (scram-sha-256), as on a real
    server; without one they are trusted. `settings` are extra server settings
    (`-c name=value`), e.g. `shared_preload_libraries`. `in_memory` puts the cluster on
    the machine's memory file system when it has room (tests; a benchmark keeps a disk).
    """

    def __init__(
        self,
        *,
        password: str | None = None,
        settings: Mapping[str, str] | None = None,
        in_memory: bool = False,
    ) -> None:
        missing = [tool for tool in ("initdb", "pg_ctl", "postgres") if shutil.which(tool) is None]
        if missing:
            raise PostgresSetupError(
                f"PostgreSQL server binaries not on PATH: {', '.join(missing)}; install them "
                "(.ci/run does) and put their bin directory on PATH."
            )
        # Not under pytest's private tmp root: the postgres user must be able to reach it.
        parent = memory_dir() if in_memory else None
        self.base = Path(tempfile.mkdtemp(prefix="piw-postgres-", dir=parent))
        self.data_dir, socket_dir = self.base / "data", self.base / "socket"
        self.log_file = self.base / "server.log"
        socket_dir.mkdir()
        initdb = ["initdb", "-D", str(self.data_dir), "-U", "postgres", "--no-sync"]
        if password is None:
            initdb += ["-A", "trust"]
        else:
            password_file = self.base / "password"
            password_file.write_text(password + "\n")
            initdb += [
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                f"--pwfile={password_file}",
            ]
        if os.geteuid() == 0:
            for path in (self.base, socket_dir, *self.base.glob("password")):
                shutil.chown(path, user="postgres")
        self.port = _free_port()
        _run_postgres_tool(initdb, self.log_file)
        extra = "".join(f" -c {name}={value}" for name, value in (settings or {}).items())
        self.options = (
            f"-p {self.port} -k {socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off{extra}"
        )
        self.server = PostgresServer("127.0.0.1", self.port, "postgres", password)
        self.start()

    def start(self) -> None:
        """Start the server and return once it accepts connections over TCP (`pg_ctl -w`
        can return while a restarted server still answers "starting up")."""
        import psycopg2

        _run_postgres_tool(
            ["pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file)]
            + ["-o", self.options, "-w", "start"],
            self.log_file,
        )

        def accepts() -> bool:
            try:
                psycopg2.connect(self.server.url("postgres"), connect_timeout=2).close()
            except psycopg2.OperationalError:
                return False
            return True

        wait_until(accepts, timeout=60, what="the PostgreSQL server to accept connections")

    def stop(self, mode: str = "fast") -> None:
        _run_postgres_tool(
            ["pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop"], self.log_file
        )

    def is_running(self) -> bool:
        status = subprocess.run(
            _as_postgres_user(["pg_ctl", "-D", str(self.data_dir), "status"]),
            capture_output=True,
            timeout=60,
        )
        return status.returncode == 0

    def destroy(self) -> None:
        subprocess.run(
            _as_postgres_user(
                ["pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop"]
            ),
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(self.base, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _as_postgres_user(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root; drop to the `postgres` user when we are root."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *command]
    return command


def _run_postgres_tool(command: list[str], log_file: Path) -> None:
    result = subprocess.run(_as_postgres_user(command), capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        server_log = log_file.read_text() if log_file.exists() else "(no server log)"
        raise PostgresSetupError(
            f"{command[0]} failed with exit {result.returncode}:\n{result.stdout}"
            f"{result.stderr}\n{server_log}"
        )
