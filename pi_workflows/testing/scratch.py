"""Where the test kit keeps what a test writes: memory when the machine has room for it.

A test's state (SQLite files, a PostgreSQL cluster) lives for seconds and is thrown
away, so a disk's durability only costs it time: on this project's 2-core machines an
fsync took 0.24 ms on disk and nothing in memory, and PostgreSQL's CREATE DATABASE of
the test template 420-440 ms on disk (its copy waits on writeback, even with fsync off)
against 17 ms in memory. Nothing a test checks depends on the disk, except what the
disk-full tests mount for themselves.
"""

from __future__ import annotations

import os

MEMORY_DIR = "/dev/shm"
# Room for a test session (a PostgreSQL cluster per test process, ~40 MB each after
# initdb, and the tests' homes): a container's default /dev/shm of 64 MB is too small and
# is not used.
MEMORY_DIR_ROOM = 2 << 30


def memory_dir() -> str | None:
    """MEMORY_DIR when it is writable and has MEMORY_DIR_ROOM free, else None (the
    system's temporary directory, as `tempfile` chooses it)."""
    try:
        stats = os.statvfs(MEMORY_DIR)
    except OSError:
        return None
    if not os.access(MEMORY_DIR, os.W_OK | os.X_OK):
        return None
    return MEMORY_DIR if stats.f_bavail * stats.f_frsize >= MEMORY_DIR_ROOM else None
