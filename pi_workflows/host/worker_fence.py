"""Until when a host's workers may run without hearing from it again.

A host renews its lease and its runs' claims on every heartbeat. Once they lapse another
host (PostgreSQL) may take the runs over and run the same node, so a worker must not
outlive them: after each renewal, and right after a launch, the host tells each worker a
**fence time** (a `host.lease` frame). A worker that reaches its fence time without a newer
one stops its node's processes and exits (`pi_workflows.worker.lease_fence`), whatever
kept its host quiet: SIGSTOP, a suspended machine, a blocked event loop, a lost database.

The fence time is the start of the last renewal plus the shorter lease, less a margin
that covers the worker's own reaction time and the clock difference between hosts (the
lease is wall-clock time compared by the other hosts with their own clocks).
"""

from __future__ import annotations

from ..clock import now_ms

MAX_MARGIN_MS = 2000
# Waking up, killing the node's process groups and exiting takes milliseconds; the
# rest of the margin is for clocks that disagree.
MIN_MARGIN_MS = 50


def margin_ms(lease_ms: int) -> int:
    """2 s, or a quarter of a lease shorter than 8 s."""
    return max(MIN_MARGIN_MS, min(MAX_MARGIN_MS, lease_ms // 4))


class LeaseClock:
    """When this host last renewed its lease (epoch ms), and the fence time that follows."""

    def __init__(self, host_lease_ms: int, run_lease_ms: int) -> None:
        self.lease_ms = min(host_lease_ms, run_lease_ms)
        self._renewed_at: int | None = None

    @staticmethod
    def renewal_starts() -> int:
        """Read before the renewal's transaction: the lease it writes lasts at least
        from then (its own clock reading comes later)."""
        return now_ms()

    def renewed(self, started_at: int) -> None:
        """The renewal that started at `started_at` committed."""
        self._renewed_at = started_at

    def fence_at(self) -> int:
        """The fence time for this host's workers now; a run claimed since the last
        renewal holds its claim at least as long."""
        assert self._renewed_at is not None, "the host takes its lease before any launch"
        return self._renewed_at + self.lease_ms - margin_ms(self.lease_ms)
