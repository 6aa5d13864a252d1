"""Interactive requests and the submissions of their output: the rows a session's step
interactions read and write (SPEC §9.5). Call everything inside ``StateStore.transaction()``.
"""

from __future__ import annotations

from typing import Any

from .blobs import put_json
from .models import InteractiveRequest as InteractiveRequest
from .models import InteractiveSubmission as InteractiveSubmission
from .prepared import PreparedQuery


def get_request(request_id: str) -> InteractiveRequest:
    """The interactive request `request_id` (peewee's DoesNotExist when there is none)."""
    return InteractiveRequest.get_by_id(request_id)


def find_request(request_id: str) -> InteractiveRequest | None:
    """The interactive request `request_id`, or None."""
    return InteractiveRequest.get_or_none(InteractiveRequest.request_id == request_id)


def pending_step_request_of_run(run_id: str) -> InteractiveRequest | None:
    """The run's pending request for a step's output (not a decision's), or None."""
    return InteractiveRequest.get_or_none(
        (InteractiveRequest.run == run_id)
        & (InteractiveRequest.status == "pending")
        & (InteractiveRequest.kind != "decision")
    )


def bump_request_revision(request_id: str) -> None:
    """Give the request a new revision: what a session showed of it is stale."""
    InteractiveRequest.update(revision=InteractiveRequest.revision + 1).where(
        InteractiveRequest.request_id == request_id
    ).execute()


def cancel_request(request_id: str, at: int) -> None:
    """Cancel the request at `at`, with a new revision."""
    InteractiveRequest.update(
        status="cancelled", revision=InteractiveRequest.revision + 1, updated_at=at
    ).where(InteractiveRequest.request_id == request_id).execute()


def count_unproductive_end(request_id: str, at: int) -> int | None:
    """Count one more turn of the pending request that ended without a valid submission;
    the new count, or None when the request is no longer pending."""
    changed = (
        InteractiveRequest.update(
            unproductive_turn_ends=InteractiveRequest.unproductive_turn_ends + 1,
            revision=InteractiveRequest.revision + 1,
            updated_at=at,
        )
        .where(
            (InteractiveRequest.request_id == request_id) & (InteractiveRequest.status == "pending")
        )
        .execute()
    )
    if changed != 1:
        return None
    return InteractiveRequest.get_by_id(request_id).unproductive_turn_ends


def is_validating(request_id: str) -> bool:
    """Does a submission of this request wait for the node's validator?"""
    return (
        InteractiveSubmission.select()
        .where(
            (InteractiveSubmission.request == request_id)
            & (InteractiveSubmission.outcome == "validating")
        )
        .exists()
    )


def submission_for(
    request_id: str, idempotency_key: str, submission_id: str
) -> InteractiveSubmission | None:
    """The request's submission sent with `idempotency_key` as its submissionId, else the
    row `submission_id`, or None."""
    return InteractiveSubmission.get_or_none(
        (InteractiveSubmission.request == request_id)
        & (InteractiveSubmission.idempotency_key == idempotency_key)
    ) or InteractiveSubmission.get_or_none(InteractiveSubmission.submission_id == submission_id)


def record_validating_submission(
    submission_id: str,
    request_id: str,
    idempotency_key: str,
    request_revision: int,
    payload_hash: str,
    at: int,
) -> InteractiveSubmission:
    """Insert a submission of the request's output that waits for the node's validator."""
    return InteractiveSubmission.create(
        submission_id=submission_id,
        request=request_id,
        idempotency_key=idempotency_key,
        request_revision=request_revision,
        payload_hash=payload_hash,
        outcome="validating",
        submitted_at=at,
    )


def get_submission(submission_id: str) -> InteractiveSubmission:
    """The submission `submission_id` (peewee's DoesNotExist when there is none)."""
    return InteractiveSubmission.get_by_id(submission_id)


# Asked at every poll, and almost always empty: the prepared check spares building the join.
_ANY_VALIDATING = PreparedQuery(
    lambda p: (
        InteractiveSubmission.select(InteractiveSubmission.submission_id)
        .where(InteractiveSubmission.outcome == "validating")
        .limit(1)
    )
)


def validating_submissions() -> list[InteractiveSubmission]:
    """Every submission that waits for its node's validator, with its request."""
    if not _ANY_VALIDATING.exists():
        return []
    return list(
        InteractiveSubmission.select(InteractiveSubmission, InteractiveRequest)
        .join(InteractiveRequest)
        .where(InteractiveSubmission.outcome == "validating")
    )


def reject_validating_submissions_of(request_id: str, error: str) -> None:
    """Reject the request's submissions that still wait for the validator, with `error`."""
    _reject_validating(InteractiveSubmission.request == request_id, error)


def reject_validating_submission(submission_id: str, error: str) -> None:
    """Reject the submission if it still waits for the validator, with `error`."""
    _reject_validating(InteractiveSubmission.submission_id == submission_id, error)


def _reject_validating(which: Any, error: str) -> None:
    InteractiveSubmission.update(
        outcome="rejected", receipt_hash=put_json({"status": "rejected", "error": error})
    ).where(which & (InteractiveSubmission.outcome == "validating")).execute()
