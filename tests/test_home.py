"""Where state lives, and refusing homes that other users could tamper with."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest

from pi_workflows.errors import UnsafeHomeError
from pi_workflows.home import Home, config_dir, resolve_home
from pi_workflows.storage import open_state


def test_home_resolution_prefers_option_then_env_then_platform(home_env, tmp_path, monkeypatch):
    assert resolve_home(tmp_path / "explicit").root == (tmp_path / "explicit").resolve()
    assert resolve_home().root == home_env.home.root
    monkeypatch.delenv("PI_WORKFLOWS_HOME")
    assert resolve_home().root.name == "pi-workflows"
    assert config_dir() == home_env.config_dir.resolve()


def test_a_home_writable_by_others_is_refused(tmp_path):
    root = tmp_path / "shared-home"
    root.mkdir()
    os.chmod(root, 0o777)

    with pytest.raises(UnsafeHomeError, match="writable by other users") as refused:
        open_state(Home(root))

    assert f"chmod 700 {root}" in str(refused.value)
    assert not (root / "state.sqlite").exists()


def test_the_cli_refuses_an_unsafe_home_with_a_one_line_error(home_env, tmp_path):
    root = tmp_path / "group-writable"
    root.mkdir()
    os.chmod(root, 0o770)

    result = home_env.run_cli("--home", str(root), "state", "status")

    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: State directory") and result.stderr.count("\n") == 1
    assert "writable by other users" in result.stderr
    assert list(root.iterdir()) == []


def test_an_unsafe_host_directory_inside_a_safe_home_is_refused(home_env):
    open_state(home_env.home).close()
    os.chmod(home_env.home.host_dir, 0o777)

    result = home_env.run_cli("state", "status")

    assert result.returncode == 1
    assert str(home_env.home.host_dir) in result.stderr


def _directory_of_another_user(tmp_path):
    """A private directory someone else owns: given to `nobody` as root, else root's `/`."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.stat("/").st_uid).pw_uid, "/"
    nobody = pwd.getpwnam("nobody")
    root = tmp_path / "someone-elses"
    root.mkdir(mode=0o700)
    shutil.chown(root, user=nobody.pw_uid, group=nobody.pw_gid)
    return nobody.pw_uid, str(root)


def test_a_home_owned_by_another_user_is_refused(home_env, tmp_path):
    owner_uid, root = _directory_of_another_user(tmp_path)
    before = sorted(os.listdir(root))

    with pytest.raises(UnsafeHomeError, match=f"owned by uid {owner_uid}"):
        open_state(Home(Path(root)))

    result = home_env.run_cli("--home", root, "state", "status")
    assert result.returncode == 1
    assert "not by you" in result.stderr and result.stderr.count("\n") == 1
    assert sorted(os.listdir(root)) == before
