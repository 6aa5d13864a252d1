"""Decision channels: a channel that hangs must not slow the host.

The webhook channel is tested with its distribution, plugins/pi-workflows-webhook.
"""

from __future__ import annotations

import json
import time

import pytest

from .conftest import HostHarness, decision_workflow, pending_decision, wait_until, write_channels

STUCK_CHANNEL = """
import json
import time
from pathlib import Path

from pi_workflows.plugin import hookimpl


class StuckChannel:
    def __init__(self, context):
        self.started = Path(context.options["started"])
        self.release = Path(context.options["release"])

    def deliver(self, request):
        self.started.write_text("delivering")
        deadline = time.monotonic() + 60
        while not self.release.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return {"stuck": False}

    def settle(self, request, resolution, delivery):
        return {}

    def close(self):
        return None


@hookimpl
def piw_register_decision_channels(register):
    register("stuck", StuckChannel)
"""


def test_a_hanging_channel_does_not_slow_the_host(harness: HostHarness):
    harness.add_plugin("stuck_channel", STUCK_CHANNEL)
    started, release = harness.root / "started", harness.root / "release"
    write_channels(
        harness,
        {
            "audiences": {"operator": ["cli", "stuck"]},
            "channels": {
                "stuck": {"kind": "stuck", "started": str(started), "release": str(release)}
            },
        },
    )
    harness.write_workflow("decide", decision_workflow(None))
    harness.start_host()
    run_id = harness.start_run("decide")
    wait_until(started.exists, what="the stuck channel's delivery to begin")

    client = harness.client()
    round_trips = []
    for _ in range(20):
        began = time.perf_counter()
        client.run_status(run_id)
        round_trips.append(time.perf_counter() - began)
    assert max(round_trips) < 0.5, round_trips
    decision_id = pending_decision(harness, run_id)["decisionId"]
    began = time.perf_counter()
    assert client.answer_decision(decision_id, "ship").outcome == "accepted"
    assert time.perf_counter() - began < 1.0
    client.close()

    release.touch()
    wait_until(
        lambda: (
            harness.query(
                "SELECT status FROM effects WHERE effect_type = 'channel.settlement' "
                "AND idempotency_key = ?",
                f"{decision_id}|stuck",
            )
            == [("applied",)]
        ),
        what="the stuck channel to deliver and settle once released",
    )


# Its close() takes a moment, as a channel's that flushes to a remote service does: the
# host must wait for it before its process exits.
CLOSING_CHANNEL = """
import time
from pathlib import Path

from pi_workflows.plugin import hookimpl


class ClosingChannel:
    def __init__(self, context):
        self.closed = Path(context.options["closed"])

    def deliver(self, request):
        return {"delivered": True}

    def settle(self, request, resolution, delivery):
        return {}

    def close(self):
        time.sleep(0.5)
        self.closed.write_text("closed")


@hookimpl
def piw_register_decision_channels(register):
    register("closing", ClosingChannel)
"""


@pytest.mark.integration
def test_a_stopping_host_closes_its_channels(harness: HostHarness):
    harness.add_plugin("closing_channel", CLOSING_CHANNEL)
    closed = harness.root / "closed"
    write_channels(harness, {"channels": {"closer": {"kind": "closing", "closed": str(closed)}}})
    harness.start_host()
    assert not closed.exists()
    harness.cli("host", "stop")
    wait_until(closed.exists, what="the channel's close() during host stop")


DESK_CHANNEL = """
from pi_workflows import hookimpl


class Desk:
    def __init__(self, context):
        self.context = context

    def deliver(self, request):
        return {"shown": True}

    def settle(self, request, resolution, delivery):
        return {}

    def close(self):
        return None

    def answer_actor(self, answer):
        return "front-desk"


@hookimpl
def piw_register_decision_channels(register):
    register("desk", Desk)
"""


@pytest.mark.hook_effect("piw_register_decision_channels")
def test_a_channel_kind_decides_who_answers_through_decision_answer(harness: HostHarness):
    harness.add_plugin("desk_channel", DESK_CHANNEL)
    write_channels(
        harness,
        {"audiences": {"operator": ["desk"]}, "channels": {"desk": {"kind": "desk"}}},
    )
    harness.write_workflow("decide", decision_workflow(None))
    harness.start_host()
    run_id = harness.start_run("decide")
    decision_id = pending_decision(harness, run_id)["decisionId"]
    harness.wait_for_status(run_id, "waiting")  # the decision is written before the park
    # `run why` names only the answer paths of this audience: no `decision answer`.
    why = json.loads(harness.cli("run", "why", run_id, "--json").stdout)
    assert (why["code"], why["next"]) == ("decision", "answer it through channel desk")
    client = harness.client()
    refused = client.answer_decision(decision_id, "ship")  # cli is not in this audience
    assert refused.outcome == "rejected"
    answered = client.answer_decision(decision_id, "ship", channel="desk")
    client.close()
    assert answered.outcome == "accepted", answered.error
    winner = harness.query(
        "SELECT channel, actor FROM human_decision_resolutions WHERE decision_id = ?",
        decision_id,
    )
    assert winner == [("desk", "front-desk")]


FLAKY_CHANNEL = """
from pathlib import Path

from pi_workflows import hookimpl
from pi_workflows.plugin import ChannelDeliveryError


class Flaky:
    def __init__(self, context):
        self.fixed = Path(context.options["fixed"])
        self.delivered = Path(context.options["delivered"])

    def deliver(self, request):
        if not self.fixed.exists():
            raise ChannelDeliveryError("the chat service answered 503")
        self.delivered.write_text(request["decisionId"])
        return {"shown": True}

    def settle(self, request, resolution, delivery):
        return {}

    def close(self):
        return None


@hookimpl
def piw_register_decision_channels(register):
    register("flaky", Flaky)
"""


@pytest.mark.scenario("10.17")
def test_a_delivery_that_gave_up_is_sent_again_by_effects_retry(harness: HostHarness):
    """An audience whose only channel failed every automatic attempt is not stuck: the
    operator retries the delivery once the channel works again. Until then, a delivery the
    host will retry and one it gave up on are told apart."""
    fixed, delivered = harness.root / "fixed", harness.root / "delivered"
    harness.add_plugin("flaky_channel", FLAKY_CHANNEL)
    options = {"kind": "flaky", "fixed": str(fixed), "delivered": str(delivered)}
    write_channels(harness, {"audiences": {"operator": ["flaky"]}, "channels": {"flaky": options}})
    harness.write_workflow("decide", decision_workflow(None))
    harness.start_host()
    run_id = harness.start_run("decide")
    pending_decision(harness, run_id)

    client = harness.client()

    def delivery() -> dict | None:
        return next((e for e in client.list_effects() if e["scope"] == "channel"), None)

    # A failed attempt that will be retried says when; it has not given up.
    retrying = wait_until(
        lambda: (effect := delivery()) and effect["status"] == "rejected" and effect,
        timeout=20,
        what="a failed delivery attempt",
    )
    assert retrying["attempts"] < 3, retrying
    assert retrying["gaveUp"] is False and retrying["nextAttemptAt"] is not None
    gave_up = wait_until(
        lambda: (
            (effect := delivery())["attempts"] >= 3 and effect["status"] == "rejected" and effect
        ),
        timeout=20,
        what="the delivery to give up after three attempts",
    )
    client.close()
    assert gave_up["gaveUp"] is True and gave_up["nextAttemptAt"] is None
    assert "error" in gave_up and "503" in gave_up["error"]
    shown = harness.cli("effects", "list").stdout
    assert f"{gave_up['effectId']}  rejected (gave up)  channel.delivery" in shown
    assert f"send it again: pi-workflows effects retry {gave_up['effectId']}" in shown
    assert _channel_status(harness)["gaveUp"] == [gave_up["effectId"]]
    fixed.touch()
    harness.cli("effects", "retry", gave_up["effectId"])
    wait_until(delivered.exists, timeout=30, what="the retried delivery")
    client = harness.client()
    assert wait_until(lambda: delivery()["status"] == "applied", what="the delivery applied")
    client.close()


DOWN_CHANNEL = """
import json
import time
from pathlib import Path

from pi_workflows import hookimpl
from pi_workflows.plugin import ChannelDeliveryError


class Down:
    def __init__(self, context):
        self.calls = Path(context.options["calls"])

    def _note(self, entry):
        with self.calls.open("a") as handle:
            handle.write(json.dumps({**entry, "at": time.time()}) + "\\n")

    def deliver(self, request):
        self._note({"call": "deliver"})
        raise ChannelDeliveryError("the pager service answered 503")

    def gave_up(self, request, purpose, error):
        self._note({"call": "gave_up", "decision": request["decisionId"], "purpose": purpose,
                    "error": error})


@hookimpl
def piw_register_decision_channels(register):
    register("down", Down)
"""


def test_a_channels_delivery_policy_sets_its_attempts_and_delay_and_it_hears_it_gave_up(
    harness: HostHarness,
):
    calls = harness.root / "calls.jsonl"
    harness.add_plugin("down_channel", DOWN_CHANNEL)
    policy = {"kind": "down", "calls": str(calls), "delivery_attempts": 2, "retry_delay_ms": 400}
    write_channels(harness, {"audiences": {"operator": ["down"]}, "channels": {"down": policy}})
    harness.write_workflow("decide", decision_workflow(None))
    harness.start_host()
    run_id = harness.start_run("decide")
    decision_id = pending_decision(harness, run_id)["decisionId"]

    def entries() -> list[dict]:
        if not calls.exists():
            return []
        return [json.loads(line) for line in calls.read_text().splitlines()]

    wait_until(
        lambda: any(e["call"] == "gave_up" for e in entries()),
        timeout=30,
        what="the channel to hear its delivery gave up",
    )
    (first, second, gave_up) = entries()
    assert [first["call"], second["call"]] == ["deliver", "deliver"]  # 2 attempts, not 3
    assert second["at"] - first["at"] >= 0.4  # retry 1 waits 1 × retry_delay_ms
    assert (gave_up["decision"], gave_up["purpose"]) == (decision_id, "delivery")
    assert gave_up["error"] == "the pager service answered 503"
    client = harness.client()
    (effect,) = [e for e in client.list_effects() if e["scope"] == "channel"]
    client.close()
    assert (effect["attempts"], effect["status"], effect["gaveUp"]) == (2, "rejected", True)
    assert "decision channel down gave up the delivery" in harness.host_log()
    # The channel's own error text stays out of the log (an id may contain "503").
    line = harness.host_log().split("gave up the delivery")[1].splitlines()[0]
    assert "pager service answered" not in line

    # An operator's retry is one more attempt: it fails, and the channel hears it again.
    harness.cli("effects", "retry", effect["effectId"])
    wait_until(
        lambda: [e["call"] for e in entries()].count("gave_up") == 2,
        timeout=30,
        what="the retried delivery to give up again",
    )
    assert [e["call"] for e in entries()].count("deliver") == 3


def test_a_bad_delivery_policy_is_refused_in_one_sentence(tmp_path):
    from pi_workflows.errors import ChannelConfigError
    from pi_workflows.host.decision_channel_runner import load_channel_config

    config = tmp_path / "channels.json"
    config.write_text(json.dumps({"channels": {"ops": {"delivery_attempts": 0}}}))
    config.chmod(0o600)
    with pytest.raises(
        ChannelConfigError, match="delivery_attempts must be a whole number of at least 1, got 0"
    ):
        load_channel_config(tmp_path)


@pytest.mark.scenario("10.12")
def test_a_channel_without_deliver_or_settle_is_recorded_by_the_decisions_own_commits(
    harness: HostHarness,
):
    harness.add_plugin("desk_channel", DESK_CHANNEL)
    write_channels(
        harness,
        {"audiences": {"operator": ["cli", "desk"]}, "channels": {"desk": {"kind": "desk"}}},
    )
    harness.write_workflow("decide", decision_workflow(None))
    harness.start_host()
    run_id = harness.start_run("decide")
    decision_id = pending_decision(harness, run_id)["decisionId"]

    def effects(kind: str) -> dict[str, str]:
        rows = harness.query(
            "SELECT idempotency_key, status FROM effects WHERE effect_type = ?", kind
        )
        return {key.split("|")[1]: status for key, status in rows}

    # Read as soon as the decision is listed: the built-in cli channel has no deliver,
    # so the commit that created the decision recorded its delivery, with no call.
    assert effects("channel.delivery")["cli"] == "applied"
    cli_result = harness.query(
        "SELECT result_hash FROM effects WHERE effect_type = ? AND idempotency_key = ?",
        "channel.delivery",
        f"{decision_id}|cli",
    )
    assert cli_result == [(None,)]  # nothing was called, so nothing came back
    wait_until(
        lambda: effects("channel.delivery") == {"cli": "applied", "desk": "applied"},
        what="both deliveries",
    )
    client = harness.client()
    assert client.answer_decision(decision_id, "ship", channel="desk").outcome == "accepted"
    client.close()
    # Read right after the answer: the built-in cli channel has no settle, so its
    # settlement was recorded applied by the answer's commit; desk's was begun there
    # and its settle call comes after.
    settlements = effects("channel.settlement")
    assert settlements["cli"] == "applied"
    assert settlements["desk"] in ("applying", "applied")
    wait_until(
        lambda: effects("channel.settlement")["desk"] == "applied", what="desk's settle call"
    )


FAILING_START_CHANNEL = """
from pi_workflows import hookimpl


class Broken:
    def __init__(self, context):
        raise RuntimeError("the chat service refused our credentials")


@hookimpl
def piw_register_decision_channels(register):
    register("broken", Broken)
"""


def _channel_status(harness: HostHarness) -> dict:
    client = harness.client()
    try:
        via_op = client.call("channel.status")
        assert client.host_status()["channels"] == via_op
        return via_op
    finally:
        client.close()


@pytest.mark.scenario("1.17")
def test_an_invalid_channel_configuration_is_shown_in_host_status(harness: HostHarness):
    write_channels(harness, {"audiences": {"operator": ["cli", "unsupported"]}})
    harness.start_host()
    status = _channel_status(harness)
    assert status["configured"] is False
    assert "references unknown channel 'unsupported'" in status["error"]
    # The host carries on with the built-ins.
    assert {c["channel"]: c["state"] for c in status["channels"]} == {
        "session": "running",
        "cli": "running",
    }
    shown = harness.cli("host", "status").stdout
    assert "decision channels NOT CONFIGURED (built-ins only): " in shown
    assert "references unknown channel 'unsupported'" in shown


@pytest.mark.scenario("1.17")
def test_a_channel_that_fails_to_start_is_shown_in_host_status(harness: HostHarness):
    harness.add_plugin("broken_channel", FAILING_START_CHANNEL)
    write_channels(
        harness,
        {
            "audiences": {"operator": ["cli", "broken", "ghost"]},
            "channels": {"broken": {"kind": "broken"}, "ghost": {"kind": "nobody-registers"}},
        },
    )
    harness.start_host()
    status = wait_until(
        lambda: (
            (s := _channel_status(harness))
            and all(c["state"] != "starting" for c in s["channels"])
            and s
        ),
        what="every channel started or failed",
    )
    assert status["configured"] is True and status["error"] is None
    by_name = {c["channel"]: c for c in status["channels"]}
    assert by_name["cli"]["state"] == "running" and by_name["cli"]["error"] is None
    assert by_name["broken"]["state"] == "failed"
    assert "the chat service refused our credentials" in by_name["broken"]["error"]
    assert by_name["ghost"] == {
        "channel": "ghost",
        "kind": "nobody-registers",
        "state": "failed",
        "error": "unknown kind 'nobody-registers' (no plugin registers it)",
    }
    shown = harness.cli("host", "status").stdout
    assert "broken failed" in shown and "ghost failed" in shown
    assert "  broken: failed to start: RuntimeError: the chat service refused" in shown
