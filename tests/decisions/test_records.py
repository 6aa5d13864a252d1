"""Request records, channel effects and channel configuration, on a real state store."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pi_workflows.clock import now_ms
from pi_workflows.errors import ChannelConfigError, ConflictError, InvalidInputError
from pi_workflows.host.decision_channel_runner import load_channel_config
from pi_workflows.storage import (
    StateStore,
    channel_effects,
    decision_presentation,
    decision_records,
    decision_resolutions,
    effects,
    read_json,
)
from pi_workflows.storage.models import Effect, HumanDecisionResolution, Lease, Run, RunQueue
from pi_workflows.storage.runs import get_run

CHOICES = {"ship": {"label": "Ship"}, "stop": {"label": "Stop"}}


def _request(**changes: object) -> dict:
    request = {
        "nodeId": "approve",
        "attemptId": "attempt-1",
        "audience": "operator",
        "title": "Ship it?",
        "subject": {"plan": [1, 2]},
        "presentation": {"summary": "Ready.", "blocks": [{"type": "paragraph", "text": "Go"}]},
        "choices": CHOICES,
        "onTimeout": {"after_ms": 1000, "response": {"choice": "stop"}},
    }
    return {**request, **changes}


@pytest.mark.scenario("10.1", "10.19")
def test_request_records_are_deterministic_immutable_and_keep_the_subject(store, make_run):
    with store.transaction():
        make_run("run-1")
        record, created = decision_records.create_request("run-1", _request())
        again, created_again = decision_records.create_request("run-1", _request())
    assert created and not created_again and again == record
    assert record["schema"] == "pi-workflows.human-decision-request.v1"
    assert record["decisionId"].startswith("decision-") and len(record["decisionId"]) == 49
    assert record["subjectDigest"].startswith("sha256:") and "subject" not in record
    assert record["defaultResponse"] == {"choice": "stop"} and record["expiresAt"]
    decision = decision_records.get_decision(record["decisionId"])
    assert decision_records.full_request(decision)["subject"] == {"plan": [1, 2]}
    assert "subject" not in decision_records.channel_request(decision)
    with store.transaction(), pytest.raises(ConflictError, match="request conflicts"):
        decision_records.create_request("run-1", _request(title="Ship it now?"))


@pytest.mark.parametrize(
    ("presentation", "message"),
    [
        ({"blocks": [{"type": "table"}]}, "must have a type among"),
        ({"blocks": [{"type": "paragraph", "text": "bell\x07"}]}, "control characters"),
        ({"blocks": [{"type": "bullets", "items": []}]}, "non-empty list"),
        ({"blocks": [{"type": "paragraph", "text": "x"}] * 257}, "at most 256 blocks"),
        ({"blocks": [{"type": "preformatted", "text": "x" * 16_001}]}, "limit is 16000"),
        ({"blocks": [{"type": "paragraph", "text": "y" * 9000}] * 8}, "limit is 64000"),
    ],
)
def test_presentations_are_validated_before_a_decision_exists(presentation, message):
    with pytest.raises(InvalidInputError, match=message):
        decision_presentation.normalize_presentation(presentation)


def test_answers_are_checked_against_the_choices():
    choices = {**CHOICES, "replan": {"label": "Replan", "input": {"name": "why", "prompt": "?"}}}
    check = decision_presentation.validate_response
    assert check(choices, {"choice": "ship"}, "a") == {"choice": "ship"}
    with pytest.raises(InvalidInputError, match="not a choice"):
        check(choices, {"choice": "maybe"}, "a")
    with pytest.raises(InvalidInputError, match="needs its text input 'why'"):
        check(choices, {"choice": "replan"}, "a")
    with pytest.raises(InvalidInputError, match="takes no input"):
        check(choices, {"choice": "ship", "input": {"why": "x"}}, "a")


@pytest.mark.scenario("10.12", "10.17")
def test_channel_effects_retry_three_times_then_wait_for_an_operator(store: StateStore):
    begin, finish = channel_effects.begin_channel_effect, channel_effects.finish_channel_effect
    effect_id = channel_effects.channel_effect_id("decision-1", "hook", "delivery")
    with store.transaction():
        assert begin("decision-1", "hook", "delivery", 0) == 1
        assert begin("decision-1", "hook", "delivery", 0) is None  # in flight
        assert finish(effect_id, 1, "rejected", error="HTTP 503")
        retry_at = Effect.get_by_id(effect_id).next_attempt_at
        assert begin("decision-1", "hook", "delivery", retry_at - 1) is None
        assert begin("decision-1", "hook", "delivery", retry_at) == 2
        assert finish(effect_id, 2, "rejected", error="HTTP 503")
        assert begin("decision-1", "hook", "delivery", 10**15) == 3
        assert not finish(effect_id, 2, "applied")  # a stale attempt cannot settle it
        assert finish(effect_id, 3, "rejected", error="HTTP 503")
        assert begin("decision-1", "hook", "delivery", 10**15) is None  # out of attempts

        assert begin("decision-1", "hook", "settlement", 0) == 1
        assert channel_effects.mark_interrupted_channel_effects(set()) == 1
        settlement = channel_effects.channel_effect_id("decision-1", "hook", "settlement")
        (ambiguous,) = effects.list_effects(status="ambiguous")
        assert ambiguous["effectId"] == settlement
        assert ambiguous["error"] == "host restarted without a receipt"
        assert begin("decision-1", "hook", "settlement", 10**15) is None  # never automatic
        effects.resolve(settlement, "retry", None, "client:test")
        assert begin("decision-1", "hook", "settlement", 10**15) == 2
        assert finish(settlement, 2, "ambiguous", error="timeout")
        effects.resolve(settlement, "confirm", None, "client:test")
    assert Effect.get_by_id(settlement).status == "applied"


def _write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_channel_configuration_is_private_and_reads_credentials_by_reference(tmp_path: Path):
    secret = _write(tmp_path / "hook.secret", "s3cret\n")
    config = _write(
        tmp_path / "channels.toml",
        f"""
[audiences]
operator = ["cli", "hook"]

[channels.cli]
allowed_actors = ["alice"]

[channels.hook]
kind = "webhook"
url = "http://127.0.0.1:9/hook"
secret_file = "{secret}"
""",
    )
    loaded = load_channel_config(tmp_path)
    assert loaded.channels_for("operator") == ("cli", "hook")
    assert loaded.channels_for("anyone-else") == ("session", "cli")
    hook = loaded.channels["hook"]
    assert hook.credentials == {"secret": "s3cret"} and "s3cret" not in repr(hook)
    assert hook.options == {"url": "http://127.0.0.1:9/hook"}
    assert loaded.channels["cli"].allows("alice") and not loaded.channels["cli"].allows("eve")

    os.chmod(secret, 0o644)
    with pytest.raises(ChannelConfigError, match="readable by others"):
        load_channel_config(tmp_path)
    os.chmod(config, 0o644)
    with pytest.raises(ChannelConfigError, match="chmod 600"):
        load_channel_config(tmp_path)
    config.unlink()
    _write(tmp_path / "channels.json", json.dumps({"audiences": {"operator": ["nope"]}}))
    with pytest.raises(ChannelConfigError, match="unknown channel 'nope'"):
        load_channel_config(tmp_path)


@pytest.mark.scenario("10.8")
def test_a_decision_without_a_default_never_expires(store, make_run):
    with store.transaction():
        make_run("run-2")
        record, _ = decision_records.create_request("run-2", _request(onTimeout=None))
    assert record["deadlineAt"] is None and record["defaultResponse"] is None
    assert decision_resolutions.expired_decisions(10**15) == []


def _park(run_id: str, *, owner: str | None = None) -> None:
    """The run waits at its decision with its queue row parked (claimed by `owner`)."""
    Run.update(status="waiting").where(Run.run_id == run_id).execute()
    RunQueue.update(status="parked").where(RunQueue.run == run_id).execute()
    expires, token = (now_ms() + 60_000, "0" * 64) if owner else (None, None)
    Lease.update(owner_id=owner, token_hash=token, expires_at=expires).where(
        Lease.run == run_id
    ).execute()


def _stored_continuation(decision_id: str) -> str | None:
    return HumanDecisionResolution.get_by_id(decision_id).continuation_run_id


@pytest.mark.scenario("2.10")
def test_an_answer_to_a_parked_run_reserves_its_continuation_with_the_stored_winner(
    store, make_run
):
    with store.transaction():
        make_run("run-3")
        record, _ = decision_records.create_request("run-3", _request())
        _park("run-3")
        decision = decision_records.get_decision(record["decisionId"])
        won = decision_resolutions.resolve(
            decision, provenance="human", response={"choice": "ship"}, channel="cli", actor="al"
        )
    continuation = decision_records.continuation_id_for_decision(record["decisionId"])
    assert won.won and not won.adopted and won.continuation_run_id == continuation
    # What the answer reports is what a later reader finds stored.
    decision = decision_records.get_decision(record["decisionId"])
    assert decision.status == "accepted"
    assert won.winner == decision_records.decision_json(decision)["resolution"]
    assert _stored_continuation(record["decisionId"]) == continuation
    assert read_json(get_run(continuation).launch_options_hash) == {
        "humanDecision": {"decisionId": record["decisionId"], "response": {"choice": "ship"}}
    }
    assert RunQueue.get_by_id("run-3").status == "done"
    with store.transaction():
        repeat = decision_resolutions.resolve(
            decision, provenance="human", response={"choice": "ship"}, channel="cli", actor="al"
        )
        other = decision_resolutions.resolve(
            decision, provenance="human", response={"choice": "stop"}, channel="cli", actor="al"
        )
    assert repeat.adopted and repeat.winner == won.winner
    assert not other.won and other.winner == won.winner


@pytest.mark.scenario("10.10")
def test_an_answer_before_its_run_parks_gets_its_continuation_once_the_run_parks(store, make_run):
    with store.transaction():
        make_run("run-4")
        record, _ = decision_records.create_request("run-4", _request())
        _park("run-4", owner="worker-host")  # its worker still holds the claim
        decision = decision_records.get_decision(record["decisionId"])
        early = decision_resolutions.resolve(
            decision, provenance="human", response={"choice": "stop"}, channel="cli", actor="al"
        )
    assert early.won and early.continuation_run_id is None
    assert _stored_continuation(record["decisionId"]) is None
    with store.transaction():
        assert decision_resolutions.reserve_pending_continuations() == []  # still claimed
        _park("run-4")
        reserved = decision_resolutions.reserve_pending_continuations()
    continuation = decision_records.continuation_id_for_decision(record["decisionId"])
    assert reserved == [continuation]
    assert _stored_continuation(record["decisionId"]) == continuation
    assert read_json(get_run(continuation).launch_options_hash)["humanDecision"]["response"] == {
        "choice": "stop"
    }
    with store.transaction():
        assert decision_resolutions.reserve_pending_continuations() == []  # exactly one
