"""The client talks only to a host of its own user: home checks first, peer credentials after.

Each test serves the home's socket with an impostor that records every byte a client
sends; a refused client must exit 1 with one line, and the impostor must get nothing.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.polling import wait_until

from .conftest import HostHarness

# Binds the socket (as the user it starts as), optionally drops to another uid, then
# listens: SO_PEERCRED reports the credentials in effect at listen(). Greets every
# client like a host and appends "<bytes received>" per closed connection to RECORD.
IMPOSTOR = r"""
import os, socket, sys
path, record, drop_uid = sys.argv[1], sys.argv[2], int(sys.argv[3])
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
os.chmod(path, 0o600)
log = open(record, "a", buffering=1)
if drop_uid >= 0:
    os.setgid(drop_uid)
    os.setuid(drop_uid)
server.listen(8)
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    received = 0
    try:
        conn.sendall(b'{"connectionId":"c-1","packageVersion":"0","schema":"pi-workflows.client.v1","type":"hello"}\n')
        while chunk := conn.recv(65536):
            received += len(chunk)
    except OSError:
        pass
    log.write(f"{received}\n")
    conn.close()
"""

NOBODY = pwd.getpwnam("nobody")


class Impostor:
    def __init__(self, socket_path: Path, record: Path, *, as_user: str | None, drop_uid: int):
        command = [sys.executable, "-c", IMPOSTOR, str(socket_path), str(record), str(drop_uid)]
        if as_user is not None:
            # setpriv execs (no parent left behind to kill); a plain interpreter, as the
            # other user cannot read this checkout's venv.
            user = pwd.getpwnam(as_user)
            command = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}"]
            command += ["--clear-groups", "/usr/bin/python3"]
            command += ["-c", IMPOSTOR, str(socket_path), str(record), str(drop_uid)]
        self.record = record
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "listening"

    def connections(self) -> list[int]:
        return [int(line) for line in self.record.read_text().split()]

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def _start_with_secret(harness: HostHarness, home: Path) -> subprocess.CompletedProcess:
    return harness.cli(
        "--home",
        str(home),
        "run",
        "start",
        "hello",
        "--input-json",
        json.dumps({"name": "Ada", "token": "s3cr3t-token"}),
        check=False,
    )


@pytest.fixture
def foreign_root() -> Iterator[Path]:
    """A directory the user `nobody` can enter (the impostor's home lives in it)."""
    root = Path(tempfile.mkdtemp(prefix="piw-foreign-", dir="/tmp"))
    os.chmod(root, 0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_home_other_users_can_write_is_refused_before_connecting(
    harness: HostHarness, foreign_root: Path
):
    home = foreign_root / "home"
    (home / "host").mkdir(parents=True)
    os.chmod(home, 0o777)
    os.chmod(home / "host", 0o777)
    record = foreign_root / "record"
    record.touch()
    os.chown(record, NOBODY.pw_uid, NOBODY.pw_gid)
    os.chown(home, NOBODY.pw_uid, NOBODY.pw_gid)
    os.chown(home / "host", NOBODY.pw_uid, NOBODY.pw_gid)
    impostor = Impostor(home / "host" / "host.sock", record, as_user="nobody", drop_uid=-1)
    try:
        result = _start_with_secret(harness, home)
    finally:
        impostor.close()
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert f"owned by uid {NOBODY.pw_uid}" in result.stderr
    assert impostor.connections() == []  # refused before connecting: nothing was sent


def test_a_group_writable_home_of_ours_is_refused_before_connecting(harness: HostHarness):
    home = harness.root / "open-home"
    (home / "host").mkdir(parents=True, mode=0o700)
    os.chmod(home, 0o770)
    record = harness.root / "record"
    record.touch()
    impostor = Impostor(home / "host" / "host.sock", record, as_user=None, drop_uid=-1)
    try:
        result = _start_with_secret(harness, home)
    finally:
        impostor.close()
    assert result.returncode == 1
    assert "writable by other users" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert impostor.connections() == []


def test_a_socket_served_by_another_user_gets_nothing(harness: HostHarness):
    # The home and socket file are ours and private; only the serving process is not.
    harness.home.host_dir.mkdir(parents=True, mode=0o700)
    os.chmod(harness.home.root, 0o700)
    record = harness.root / "record"
    record.touch()
    impostor = Impostor(harness.home.socket_path, record, as_user=None, drop_uid=NOBODY.pw_uid)
    try:
        result = _start_with_secret(harness, harness.home.root)
        assert result.returncode == 1
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert f"runs as uid {NOBODY.pw_uid}" in result.stderr
        # The client connected (that is how it learnt the peer's uid), then sent nothing.
        assert wait_until(impostor.connections, what="the impostor to see the client") == [0]
    finally:
        impostor.close()


@pytest.mark.scenario("4.17")
def test_a_host_of_another_package_version_is_reported_and_gets_nothing(harness: HostHarness):
    # Our own user and a private home, but the "host" greets as pi-workflows 0.
    harness.home.host_dir.mkdir(parents=True, mode=0o700)
    os.chmod(harness.home.root, 0o700)
    record = harness.root / "record"
    record.touch()
    impostor = Impostor(harness.home.socket_path, record, as_user=None, drop_uid=-1)
    try:
        result = _start_with_secret(harness, harness.home.root)
        assert result.returncode == 1
        assert len(result.stderr.strip().splitlines()) == 1
        assert "runs pi-workflows 0" in result.stderr and "host stop" in result.stderr
        assert wait_until(impostor.connections, what="the impostor to see the client") == [0]
    finally:
        impostor.close()
