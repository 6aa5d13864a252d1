"""The kit's pytest fixtures (registered through the ``pytest11`` entry point)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..home import CONFIG_ENV, HOME_ENV
from .crash_points import CrashPoints
from .host import WorkflowHome, WorkflowHost, short_temp_dir
from .in_process import InProcessHost
from .isolation import FOREIGN_ENV, IsolatedPlugins, isolated_plugins


@pytest.fixture
def workflow_plugins() -> Iterator[IsolatedPlugins]:
    """The plugin manager with the built-ins only; ``register(plugin)`` adds one for the test."""
    with isolated_plugins() as isolated:
        yield isolated


@pytest.fixture
def workflow_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkflowHome]:
    """A private home, config dir and project, also set in this process's environment.

    A host the command line starts on demand in it is stopped afterwards.
    """
    home = WorkflowHome(short_temp_dir())
    for variable in FOREIGN_ENV:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(HOME_ENV, str(home.home.root))
    monkeypatch.setenv(CONFIG_ENV, str(home.config_dir))
    try:
        yield home
    finally:
        home.cleanup()


@pytest.fixture
def workflow_host() -> Iterator[WorkflowHost]:
    """A real host in a private home; call ``start()`` once workflows and plugins are written."""
    host = WorkflowHost(short_temp_dir())
    try:
        yield host
    finally:
        host.cleanup()


@pytest.fixture
def in_process_host() -> Iterator[InProcessHost]:
    """`workflow_host` with the host's loop in a thread of this process (not started yet)."""
    host = InProcessHost(short_temp_dir())
    try:
        yield host
    finally:
        host.cleanup()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--crash-points",
        choices=("ci", "full"),
        default="ci",
        help="crash_points fixture: 'full' kills hosts as well as workers in every case "
        "(tests choose what 'ci' covers)",
    )


@pytest.fixture
def crash_points(request: pytest.FixtureRequest) -> CrashPoints:
    """The crash-point explorer: ``crash_points.explore(CrashCase(...))`` -> a report."""
    return CrashPoints(full=request.config.getoption("--crash-points") == "full")
