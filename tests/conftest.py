"""Shared fixtures: private state homes, the CLI as a subprocess, PostgreSQL, the audit plugin.

Fixtures here are generic on purpose; every test package of the project may use them.
"""

from __future__ import annotations

import compileall
import hashlib
import importlib.metadata
import re
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pi_workflows import plugins
from pi_workflows.home import Home
from pi_workflows.storage import StateStore, open_state
from pi_workflows.testing import WorkflowHome, installed_entry_points, short_temp_dir
from pi_workflows.testing import run_record as kit_run_record
from pi_workflows.testing.polling import wait_until
from pi_workflows.testing.postgres import (
    SCHEMA_TEMPLATE,
    PostgresCluster,
    PostgresServer,
    PostgresSetupError,
)

# The test kit is also a pytest11 entry point; naming it here keeps a venv whose metadata
# predates that entry point working (pytest registers a module once). scenario_coverage
# registers the `scenario` marker and `pytest --scenarios`.
pytest_plugins = ("pi_workflows.testing.pytest_plugin", "tests.scenario_coverage", "tests.tmux")

REPO_ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def mounted_tmpfs(size: str = "8m") -> Iterator[Path]:
    """A private tmpfs of `size` on a short path (mounting needs root), unmounted after."""
    point = short_temp_dir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(point)], check=True
    )
    try:
        yield point
    finally:
        # A process of the test (a worker, a fork server) may still be ending with a file
        # or its directory there: the mount is busy until it is gone.
        wait_until(
            lambda: subprocess.run(["umount", str(point)], capture_output=True).returncode == 0,
            timeout=10,
            what=f"{point} to be unmounted (a process of the test still uses it)",
        )
        point.rmdir()


AUDIT_PLUGIN_DIR = REPO_ROOT / "plugins" / "pi-workflows-audit"


@pytest.fixture
def home_env(workflow_home: WorkflowHome) -> WorkflowHome:
    """The kit's private home, with every installed entry-point plugin enabled."""
    workflow_home.use_entry_points(*installed_entry_points())
    return workflow_home


# --- the storage backends --------------------------------------------------------------------

BACKENDS = ("sqlite", "postgresql")
# Suites whose tests run once per backend (SPEC §14): every test in them that uses the
# `backend` fixture (directly or through `store`, `database_url` or the host harness).
BOTH_BACKEND_SUITES = (
    "tests/test_storage.py",
    "tests/test_run_claims.py",
    "tests/test_postgres.py",
    "tests/test_schema_upgrade.py",
    "tests/test_retention.py",
    "tests/engine/",
    "tests/host/",
    "tests/sessions/",
    "tests/terminal/",
    "tests/decisions/",
)


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist's default hands each process a quarter of its share of the tests in one
    # consecutive block at the start: one process got every LONGEST_FIRST test. One test
    # at a time (unless asked otherwise) makes the order above the order they start in.
    if getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1
    config.addinivalue_line(
        "markers", "sqlite_only: the test is about the SQLite file itself; one backend only"
    )
    config.addinivalue_line(
        "markers", "integration: the test kills or stops a host process (not the in-process tier)"
    )
    config.addinivalue_line(
        "markers",
        "hook_effect(*hooks): the test asserts what a plugin implementing each hook changes in "
        "a running host or the real CLI (tests/test_hook_coverage.py)",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the project's modules once, before any test starts a process.

    The hosts, workers and commands the tests start are fresh interpreters. Where
    PYTHONDONTWRITEBYTECODE is set (CI's image sets it), none of them writes the bytecode
    it compiles, so each compiled every module it imported again: 40 % of the suite's CPU
    (py-spy over tests/host and tests/decisions). Up-to-date files are skipped; only the
    controller compiles (xdist's workers start after it).
    """
    if hasattr(session.config, "workerinput"):
        return
    for tree in ("pi_workflows", "plugins"):
        compileall.compile_dir(REPO_ROOT / tree, quiet=1, rx=re.compile(r"/(node_modules|\.venv)/"))


# The longest tests that keep a core busy (10 to 30 s each on 2 cores), handed out first,
# one at a time to whichever process is free (pytest_configure): one begun last would keep
# the run going alone for its length. Long tests that mostly wait (a stopped host, a
# deadline, a takeover) are left where they are: begun together they left both cores idle
# for a minute, spread out they wait beside other tests' work.
LONGEST_FIRST = (
    "tests/model/",
    "tests/crash_points/",
    "plugins/pi-workflows-webhook/tests/test_webhook_channel.py::test_the_plugins_survive_",
    "tests/view/test_viewer_web.py",
    "tests/test_types.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """LONGEST_FIRST first, then the rest in an order fixed by a hash of their ids: in
    file order, the processes took neighbouring tests together, and a file's tests that
    wait (a host stopped, a lease running out) waited at the same time while both cores
    idled. The tests share no fixture wider than one test but the session's."""
    items.sort(
        key=lambda item: (
            not item.nodeid.startswith(LONGEST_FIRST),
            hashlib.sha1(item.nodeid.encode()).digest(),
        )
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    if metafunc.definition.get_closest_marker("sqlite_only") is not None:
        return
    path = Path(metafunc.definition.path).relative_to(REPO_ROOT).as_posix()
    if path.startswith(BOTH_BACKEND_SUITES):
        metafunc.parametrize("backend", BACKENDS, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """`sqlite`, or `postgresql` for the second run of a both-backend suite's test."""
    return getattr(request, "param", "sqlite")


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest) -> Iterator[str | None]:
    """None (the home's SQLite file) or a fresh database on the session's PostgreSQL server."""
    if backend == "sqlite":
        yield None
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = server.create_database(from_template=True)
    try:
        yield url
    finally:
        server.drop_database(url)


@pytest.fixture
def store(home_env: WorkflowHome, database_url: str | None) -> Iterator[StateStore]:
    """The state store of `home_env` (on the test's backend), open in this process."""
    opened = open_state(home_env.home, database_url)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def postgres_store(home_env: WorkflowHome, postgres_server: PostgresServer) -> Iterator[StateStore]:
    """A state store on a fresh PostgreSQL database, whatever the test's backend."""
    url = postgres_server.create_database(from_template=True)
    opened = open_state(home_env.home, url)
    try:
        yield opened
    finally:
        opened.close()
        postgres_server.drop_database(url)


@pytest.fixture
def plugin_env() -> Iterator[pytest.MonkeyPatch]:
    """A MonkeyPatch for plugin variables; the process-wide plugins reload once it is undone."""
    with pytest.MonkeyPatch.context() as patch:
        yield patch
    plugins.reload()


# --- the plugin distributions of plugins/ ----------------------------------------------------


def readme_setup_command() -> str:
    """The first command of README.md's Quick start: it installs everything the tests use."""
    readme = (REPO_ROOT / "README.md").read_text()
    block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    return block.splitlines()[0]


def require_distribution(distribution: str) -> None:
    """Fail the test, naming the README's set-up command, when `distribution` is missing."""
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(
            f"{distribution} is not installed: run README.md's first command "
            f"({readme_setup_command()}).",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def audit_plugin() -> str:
    """`plugins/pi-workflows-audit`, installed by the README's set-up; its entry point name."""
    require_distribution("pi-workflows-audit")
    return "audit"


# --- PostgreSQL ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the whole session (fails loudly without the binaries)."""
    cluster = _started_cluster()
    try:
        _create_schema_template(cluster.server)
        yield cluster.server
    finally:
        cluster.destroy()


@pytest.fixture
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A PostgreSQL cluster of the test's own, with a password: the test may stop it."""
    cluster = _started_cluster(password=f"pw-{uuid.uuid4().hex}")
    try:
        yield cluster
    finally:
        cluster.destroy()


def _started_cluster(*, password: str | None = None) -> PostgresCluster:
    """A started cluster; a missing binary or failed tool fails the test, saying which."""
    try:
        return PostgresCluster(password=password, in_memory=True)
    except PostgresSetupError as error:
        pytest.fail(str(error), pytrace=False)


def _create_schema_template(server: PostgresServer) -> None:
    """A database holding the current schema, cloned by `create_database(from_template=True)`."""
    server.execute(f'CREATE DATABASE "{SCHEMA_TEMPLATE}"')
    with tempfile.TemporaryDirectory(prefix="piw-template-") as scratch:
        open_state(Home(Path(scratch) / "home"), server.url(SCHEMA_TEMPLATE)).close()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The URL of a fresh, empty database on the session's PostgreSQL server."""
    return postgres_server.create_database()


# --- runs ------------------------------------------------------------------------------------


def create_test_run(run_id: str, workflow_name: str = "hello", **options: object) -> str:
    """Insert a queued run through the storage API (call inside `store.transaction()`)."""
    from pi_workflows.storage.runs import create_run

    fields: dict[str, object] = {
        "workflow_name": workflow_name,
        "workflow_ref": f"builtin:{workflow_name}",
        "workflow_source": {"kind": "builtin", "name": workflow_name},
        "definition_digest": "0" * 64,
        "project_path": "/tmp",
        "input": {"task": run_id},
        "actor": "test",
    }
    fields.update(options)
    create_run(run_id=run_id, **fields)
    return run_id


@pytest.fixture
def make_run():
    """`make_run(run_id, workflow_name="hello", **create_run_options)` inside a transaction."""
    return create_test_run


@pytest.fixture
def run_record():
    """`run_record(**overrides)` builds a `RunRecord` without touching the database."""
    return kit_run_record
