"""Effects in doubt and the processes a run starts (SPEC §7.4, §7.4a), through real hosts,
real workers, real shell commands and signals."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.polling import process_gone

from .conftest import HostHarness, wait_until
from .workflows import PAY, slow_shell


def _starts(harness: HostHarness) -> int:
    path = harness.project / "starts"
    return len(path.read_text().split()) if path.exists() else 0


def _live_worker_pid(harness: HostHarness, run_id: str) -> int:
    return wait_until(
        lambda: next(
            (pid for _, status, pid in harness.workers(run_id) if status == "running" and pid),
            None,
        ),
        what="a running worker",
    )


def _shell_group(harness: HostHarness) -> list[int]:
    """The pids of the running shell command: itself, its child and its grandchild."""
    return [harness.wait_for_pid(name) for name in ("shell.pid", "child.pid", "grandchild.pid")]


def _start_slow_shell(harness: HostHarness, policy: str) -> str:
    """A host running `slowshell` with an `<policy>_effect`, its command started."""
    harness.write_workflow("slowshell", slow_shell(policy))
    harness.start_host()
    run_id = harness.start_run("slowshell")
    _shell_group(harness)
    return run_id


def _effects(harness: HostHarness, *args: str) -> list[dict]:
    return json.loads(harness.cli("effects", "list", "--json", *args).stdout)


@pytest.mark.scenario("3.11")
def test_worker_sigkill_during_an_idempotent_shell_node_runs_the_node_again(
    harness: HostHarness,
):
    run_id = _start_slow_shell(harness, "idempotent")
    os.kill(_live_worker_pid(harness, run_id), signal.SIGKILL)

    wait_until(lambda: _starts(harness) == 2, what="the node to run again")
    (harness.project / "release").touch()
    status = harness.wait_for_status(run_id, "completed")
    assert status["finalOutput"]["work"]["stdout"] == "done"
    [effect] = _effects(harness, "--run", run_id)
    assert effect["status"] == "applied" and effect["attempts"] == 2


@pytest.mark.scenario("3.13")
def test_a_shell_command_and_its_descendants_die_with_their_worker(harness: HostHarness):
    harness.write_workflow("slowshell", slow_shell("idempotent"))
    harness.start_host()
    run_id = harness.start_run("slowshell")
    first = _shell_group(harness)
    assert os.getpgid(first[2]) == first[0]  # the grandchild is in the command's group
    os.kill(_live_worker_pid(harness, run_id), signal.SIGKILL)

    # The old group is gone before the node can run a second time.
    wait_until(lambda: _starts(harness) == 2, what="the node to run again")
    assert all(process_gone(pid) for pid in first), first


@pytest.mark.parametrize("control", ["cancel", "pause"])
@pytest.mark.scenario("3.13")
def test_cancel_or_pause_kills_the_shell_command_and_its_descendants(
    harness: HostHarness, control: str
):
    harness.write_workflow("slowshell", slow_shell("idempotent"))
    harness.start_host()
    run_id = harness.start_run("slowshell")
    group = _shell_group(harness)
    harness.cli("run", control, run_id)
    wait_until(lambda: all(process_gone(pid) for pid in group), what="the command to die")
    status = harness.client().run_status(run_id)
    assert status["status"] == "cancelled" if control == "cancel" else status["paused"]


@pytest.mark.integration
def test_a_clean_host_stop_kills_the_shell_command_it_hands_off(harness: HostHarness):
    harness.write_workflow("slowshell", slow_shell("idempotent"))
    harness.start_host()
    harness.start_run("slowshell")
    group = _shell_group(harness)
    harness.stop()
    assert all(process_gone(pid) for pid in group), group


@pytest.mark.integration
@pytest.mark.scenario("1.5")
def test_host_sigkill_during_a_shell_node_the_next_host_kills_the_old_group_first(
    harness: HostHarness,
):
    harness.write_workflow("slowshell", slow_shell("idempotent"))
    host = harness.start_host()
    run_id = harness.start_run("slowshell")
    group = _shell_group(harness)
    host.kill()
    host.wait()
    assert not any(process_gone(pid) for pid in group)  # orphaned, still running

    harness.start_host()
    # Killed at startup, before the new host answers anyone or claims the run.
    wait_until(lambda: all(process_gone(pid) for pid in group), timeout=5, what="old group")
    wait_until(lambda: _starts(harness) == 2, what="the node to run again")
    (harness.project / "release").touch()
    harness.wait_for_status(run_id, "completed")


def _park_a_manual_effect_in_doubt(harness: HostHarness) -> tuple[str, dict]:
    run_id = _start_slow_shell(harness, "manual")
    os.kill(_live_worker_pid(harness, run_id), signal.SIGKILL)
    status = harness.wait_for_status(run_id, "waiting")
    assert status["errorCode"] == "effectAmbiguous"
    [effect] = _effects(harness, "--ambiguous")
    assert effect["runId"] == run_id and effect["policy"] == "manual"
    assert harness.client().host_status()["ambiguousEffects"] == 1
    why = harness.client().why_run(run_id)
    assert why["code"] == "effectAmbiguous"
    assert why["reason"] == f"waiting for effect {effect['effectId']} to be confirmed or retried"
    assert f"pi-workflows effects retry {effect['effectId']}" in why["next"]
    return run_id, effect


@pytest.mark.scenario("3.12")
def test_a_manual_effect_in_doubt_is_resolved_by_confirming_it(harness: HostHarness):
    run_id, effect = _park_a_manual_effect_in_doubt(harness)
    refused = harness.cli("run", "resume", run_id, check=False)
    assert refused.returncode == 1
    assert f"pi-workflows effects confirm {effect['effectId']}" in refused.stderr
    assert f"pi-workflows effects retry {effect['effectId']}" in refused.stderr

    for bad_args, message in (
        (("effects", "confirm", "effect-nope"), "Effect effect-nope does not exist"),
        (("effects", "confirm", effect["effectId"], "--result-json", "{"), "is not valid JSON"),
        (("effects", "confirm", effect["effectId"], "--result-json", "NaN"), "NaN or Infinity"),
        (
            ("effects", "confirm", effect["effectId"], "--result-json", '{"a": 1, "a": 2}'),
            "gives the key 'a' twice",
        ),
    ):
        refused = harness.cli(*bad_args, check=False)
        assert refused.returncode == 1 and message in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    harness.cli("effects", "confirm", effect["effectId"], "--result-json", '{"stdout": "by hand"}')
    status = harness.wait_for_status(run_id, "completed")
    assert status["finalOutput"] == {"work": {"stdout": "by hand"}}
    assert _starts(harness) == 1  # confirmed, so never run a second time
    assert _effects(harness, "--ambiguous") == []


@pytest.mark.scenario("3.12")
def test_a_manual_effect_in_doubt_is_resolved_by_retrying_it(harness: HostHarness):
    run_id, effect = _park_a_manual_effect_in_doubt(harness)
    client = harness.client()
    payload = {"effectId": effect["effectId"]}
    first = client.send("effects.retry", payload, idempotency_key="retry-1")
    repeat = client.send("effects.retry", payload, idempotency_key="retry-1")
    assert first.outcome == "accepted" and first.receipt["runReleased"] is True
    assert repeat.outcome == "adopted" and repeat.receipt == first.receipt  # its receipt
    wait_until(lambda: _starts(harness) == 2, what="the node to run again")
    again = harness.cli("effects", "retry", effect["effectId"], check=False)
    assert again.returncode == 1 and "only an effect in doubt" in again.stderr
    (harness.project / "release").touch()
    status = harness.wait_for_status(run_id, "completed")
    assert status["finalOutput"]["work"]["stdout"] == "done"
    [settled] = _effects(harness, "--run", run_id)
    assert settled["status"] == "applied"


def _charges(harness: HostHarness) -> int:
    path = harness.project / "charges"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _kill_the_paying_worker(harness: HostHarness, run_id: str, previous: int | None) -> dict:
    """SIGKILL the worker of `pay` mid-command; the run parks with the effect in doubt."""
    shell_pid = harness.wait_for_pid("shell.pid", previous=previous)
    os.kill(_live_worker_pid(harness, run_id), signal.SIGKILL)
    status = harness.wait_for_status(run_id, "waiting")
    assert status["errorCode"] == "effectAmbiguous"
    [effect] = _effects(harness, "--ambiguous")
    assert effect["runId"] == run_id and effect["nodeId"] == "pay"
    return {"shellPid": shell_pid, **effect}


def _start_paying_and_park_it(harness: HostHarness) -> tuple[str, dict]:
    harness.write_workflow("pay", PAY)
    harness.start_host()
    run_id = harness.start_run("pay")
    return run_id, _kill_the_paying_worker(harness, run_id, None)


def _assert_paid(
    harness: HostHarness, run_id: str, parked: dict, *, paid: str, charges: int, attempts: int
) -> None:
    """The run completed with `paid`; the command ran `charges` times in all, and the
    one effect record of the node settled `applied` after `attempts` reservations."""
    status = harness.wait_for_status(run_id, "completed", "failed")
    assert status["status"] == "completed", status["error"]
    assert status["finalOutput"] == {"paid": paid}
    assert _charges(harness) == charges
    [settled] = _effects(harness, "--run", run_id)
    assert settled["effectId"] == parked["effectId"]
    assert settled["status"] == "applied" and settled["attempts"] == attempts


@pytest.mark.scenario("3.12")
def test_retrying_a_manual_effect_runs_its_action_once_more_even_when_its_request_changes(
    harness: HostHarness,
):
    run_id, parked = _start_paying_and_park_it(harness)
    assert _charges(harness) == 1

    harness.cli("effects", "retry", parked["effectId"])
    # A retry of the retry: killed again mid-command, parked again, retried again.
    again = _kill_the_paying_worker(harness, run_id, parked["shellPid"])
    assert again["effectId"] == parked["effectId"] and again["attempts"] == 2
    assert _charges(harness) == 2
    harness.cli("effects", "retry", again["effectId"])
    harness.wait_for_pid("shell.pid", previous=again["shellPid"])
    (harness.project / "release").touch()
    # the first attempt and one per retry, no more

    _assert_paid(harness, run_id, parked, paid="paid", charges=3, attempts=3)


@pytest.mark.scenario("3.12")
def test_confirming_a_manual_effect_carries_on_without_running_its_action(
    harness: HostHarness,
):
    run_id, parked = _start_paying_and_park_it(harness)

    harness.cli("effects", "confirm", parked["effectId"], "--result-json", '{"stdout": "by hand"}')
    # confirmed, so the command never runs again: one charge, from the killed attempt
    _assert_paid(harness, run_id, parked, paid="by hand", charges=1, attempts=1)


@pytest.mark.scenario("5.9")
def test_cancel_during_a_manual_effect_leaves_it_ambiguous_and_its_attempt_interrupted(
    harness: HostHarness,
):
    run_id = _start_slow_shell(harness, "manual")
    [(generation,)] = harness.query("SELECT generation FROM leases WHERE run_id = ?", run_id)

    harness.cli("run", "cancel", run_id)
    # All of it committed with the cancel, before the command returned.
    assert harness.client().run_status(run_id)["status"] == "cancelled"
    [effect] = _effects(harness, "--run", run_id)
    assert effect["status"] == "ambiguous" and effect["policy"] == "manual"
    [(settled_at,)] = harness.query(
        "SELECT settled_at FROM effects WHERE effect_id = ?", effect["effectId"]
    )
    assert settled_at is not None
    events = harness.query(
        "SELECT event_type, lease_generation FROM events WHERE run_id = ? ORDER BY revision",
        run_id,
    )
    assert ("effect.ambiguous", generation + 1) in events
    assert events[-1] == ("run.queue_cancelled", generation + 1)
    attempts = harness.query("SELECT status FROM node_attempts WHERE node_id = 'work'")
    assert attempts == [("interrupted",)]
    # The claim's generation moved on, and nobody holds the run.
    assert harness.query("SELECT generation, owner_id FROM leases WHERE run_id = ?", run_id) == [
        (generation + 1, None)
    ]


AGENT_SCRIPT = """
echo $$ > agent.pid
sleep 300 >/dev/null 2>&1 &
echo $! > agent-child.pid
cat > /dev/null
while [ ! -e release ]; do sleep 0.05; done
echo '{"reply": "done"}'
"""


@pytest.mark.scenario("3.13")
def test_a_headless_agent_command_and_its_children_die_with_their_worker(
    harness: HostHarness, tmp_path
):
    script = tmp_path / "agent.sh"
    script.write_text(AGENT_SCRIPT)
    harness.start_host(PI_WORKFLOWS_AGENT_COMMAND=f"sh {script}")
    run_id = harness.cli(
        "run", "start", "echo", "--headless", "--project", str(harness.project)
    ).stdout.strip()
    first = [harness.wait_for_pid(name) for name in ("agent.pid", "agent-child.pid")]
    os.kill(_live_worker_pid(harness, run_id), signal.SIGKILL)

    harness.wait_for_pid("agent.pid", previous=first[0])  # the step runs again...
    assert all(process_gone(pid) for pid in first), first  # ...after the old group died
    (harness.project / "release").touch()
    assert harness.wait_for_status(run_id, "completed")["finalOutput"] == {"reply": "done"}
