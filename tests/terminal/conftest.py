"""Terminal-message tests drive a real host; they share the host tests' harness."""

from __future__ import annotations

from tests.host.conftest import harness  # noqa: F401  (the fixture, re-exported for this package)
