"""How a drive ends: fenced by abort, finished (reversing a late approval when asked),
rejected, or settled by another driver before this one."""

from __future__ import annotations

from typing import Any, Literal, NoReturn, cast

from ._actions import Fence, Finish, GiveUp, Phase, Reject, Retry, next_action
from ._context import FIRST_ABORT_S, Run, send
from ._effects import Steps
from ._exceptions import (
    APIError,
    DuplicateGuardError,
    IdempayError,
    PaymentAbortedError,
    PaymentInDoubtError,
    SuspectedDuplicateError,
    error_from_response,
)
from ._journal import JournalEntry
from ._models import Fenced, JournalState, Transaction

__all__ = ["fence", "fenced", "finish", "rejected", "settled_outcome"]


def _timeout(run: Run, remaining: float, tries: int) -> float:
    """The first call of a grace period is always sent, with at least FIRST_ABORT_S."""
    timeout = min(run.ctx.timeout, remaining)
    return timeout if tries else max(timeout, min(run.ctx.timeout, FIRST_ABORT_S))


def fence(run: Run, *, cause: IdempayError | None) -> Steps[Transaction]:
    """Abort the key: fenced → PaymentAbortedError; processed → its result; else in doubt.
    The abort is sent at least once, whatever ``abort_grace_s``."""
    ctx = run.ctx
    if run.state is not JournalState.IN_DOUBT:
        yield from run.record(JournalState.IN_DOUBT)
    grace_end = ctx.monotonic() + ctx.abort_grace_s
    last = cause or run.rejection
    tries = 0
    while tries == 0 or grace_end - ctx.monotonic() >= ctx.min_send_s:
        timeout = _timeout(run, grace_end - ctx.monotonic(), tries)
        tries += 1
        reply = yield from send(ctx, "POST", run.path("/abort"), timeout=timeout)
        action = next_action(Phase.ABORT, reply, now=ctx.now(), expect=run.expect)
        if isinstance(action, Fence):
            yield from fenced(run, action)
        if isinstance(action, Finish):
            return (yield from finish(run, action))
        if isinstance(action, GiveUp | Reject):
            last = action.error
            break
        assert isinstance(action, Retry)
        yield from run.wait(action.retry_after, grace_end)
    if not run.maybe_sent:
        yield from run.record(JournalState.ABORTED, outcome={"kind": "not_sent"})
        raise PaymentAbortedError(
            f"payment {run.key} was never sent and the deadline passed",
            key=run.key,
            reason="not_sent",
        )
    raise PaymentInDoubtError(
        f"payment {run.key}: no definitive answer, not even from abort; "
        "the journal keeps it for recover()",
        key=run.key,
    ) from last


def finish(run: Run, action: Finish) -> Steps[Transaction]:
    transaction = action.transaction
    late = run.ctx.monotonic() >= run.deadline
    if transaction.approved and late and run.entry.reverse_late_approval:
        return (yield from _reverse(run, action))
    yield from run.record(JournalState.RESOLVED, outcome=_outcome(action), result=transaction)
    return transaction


def _reverse(run: Run, approval: Finish) -> Steps[Transaction]:
    """Reverse an approval that arrived after the customer left (idempotent by id)."""
    ctx = run.ctx
    grace_end = ctx.monotonic() + ctx.abort_grace_s
    tries = 0
    while tries == 0 or grace_end - ctx.monotonic() >= ctx.min_send_s:
        timeout = _timeout(run, grace_end - ctx.monotonic(), tries)
        tries += 1
        reply = yield from send(ctx, "POST", run.path("/reversal"), timeout=timeout)
        action = next_action(Phase.REVERSAL, reply, now=ctx.now(), expect=run.expect)
        if isinstance(action, Retry):
            yield from run.wait(action.retry_after, grace_end)
            continue
        final = action if isinstance(action, Finish) else approval
        yield from run.record(
            JournalState.RESOLVED, outcome=_outcome(final), result=final.transaction
        )
        return final.transaction
    raise PaymentInDoubtError(
        f"payment {run.key} was approved after the deadline and its reversal is not "
        "confirmed; the journal keeps it for recover()",
        key=run.key,
        result=approval.transaction,
    )


def fenced(run: Run, action: Fence) -> Steps[NoReturn]:
    rejection = run.rejection
    outcome: dict[str, Any] = {"kind": "fenced", "reason": action.reason, "code": action.code}
    if isinstance(rejection, DuplicateGuardError):
        outcome.update(code=rejection.code, duplicate_of=rejection.duplicate_of)
    yield from run.record(
        JournalState.ABORTED, outcome=outcome, result=Fenced(id=run.key, status=action.reason)
    )
    if isinstance(rejection, DuplicateGuardError):
        raise SuspectedDuplicateError(
            f"payment {run.key} was refused as a suspected duplicate of "
            f"{rejection.duplicate_of} and its key fenced: never charged",
            key=run.key,
            duplicate_of=rejection.duplicate_of,
            request_id=rejection.request_id,
            detail=rejection.detail,
        ) from rejection
    error = PaymentAbortedError(
        f"payment {run.key} was {action.reason}: never charged"
        + (f" (a later attempt was rejected: {rejection})" if rejection else ""),
        key=run.key,
        reason=action.reason,
        code=rejection.code if rejection else action.code,
        status=rejection.status if rejection else None,
        request_id=action.request_id,
    )
    raise error from rejection


def rejected(run: Run, error: APIError) -> Steps[NoReturn]:
    outcome = {"kind": "error", "code": error.code, "status": error.status, "detail": error.detail}
    yield from run.record(JournalState.RESOLVED, outcome=outcome)
    raise error


def settled_outcome(entry: JournalEntry) -> Transaction:
    """What another driver recorded for a key: its transaction, or the error it raised."""
    outcome: dict[str, Any] = dict(entry.outcome or {})
    kind = outcome.get("kind")
    if entry.state is JournalState.RESOLVED and kind == "transaction":
        return Transaction.from_json(outcome.get("body"))
    fenced_report = entry.state is JournalState.REPORTED and kind == "fenced"
    if entry.state is JournalState.ABORTED and outcome.get("code") == "suspected_duplicate":
        raise SuspectedDuplicateError(
            f"payment {entry.key} was settled by another driver: a suspected duplicate",
            key=entry.key,
            duplicate_of=outcome.get("duplicate_of"),
        )
    if entry.state is JournalState.ABORTED or fenced_report:
        reason = outcome.get("reason") if kind == "fenced" else "not_sent"
        raise PaymentAbortedError(
            f"payment {entry.key} was settled by another driver: {reason}",
            key=entry.key,
            reason=cast(Literal["aborted", "expired", "not_sent"], reason or "aborted"),
            code=outcome.get("code"),
        )
    if kind == "error":
        status = outcome.get("status")
        body = {"code": outcome.get("code"), "detail": outcome.get("detail")}
        raise error_from_response(status if isinstance(status, int) else 400, {}, body)
    raise PaymentInDoubtError(
        f"payment {entry.key} was settled by another driver as {entry.state}", key=entry.key
    )


def _outcome(action: Finish) -> dict[str, Any]:
    return {"kind": "transaction", "status": action.transaction.status, "body": action.body}
