"""The payment protocol of SPEC §4 as a sans-I/O generator (see ``_effects``).

``pay`` journals a new payment and drives it; ``drive`` runs the create/lookup loop until
the deadline, then ``_fence`` aborts (and ``_reverse`` undoes a late approval when asked).
Decisions come from ``_actions.next_action``; waits from ``_retry``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, NoReturn

from ._actions import Fence, Finish, GiveUp, Phase, Reject, Retry, next_action
from ._effects import Begin, HttpReply, NoReply, Record, Reply, Send, Sleep, Steps
from ._exceptions import APIError, IdempayError, PaymentAborted, PaymentInDoubt
from ._journal import JournalEntry
from ._models import JournalState, Recovered, Transaction
from ._retry import RetryPolicy

__all__ = ["MIN_SEND_S", "Context", "drive", "pay", "recover_entry", "send", "sleep"]

MIN_SEND_S = 0.01
"""Below this much time left, a request is not worth sending."""


@dataclass(frozen=True, slots=True)
class Context:
    """Everything the protocol needs from the client that runs it."""

    headers: Mapping[str, str]
    timeout: float
    policy: RetryPolicy
    abort_grace_s: float
    clock: Callable[[], float]
    rng: random.Random

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)


def send(
    ctx: Context,
    method: Literal["GET", "POST"],
    path: str,
    *,
    timeout: float,
    content: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Steps[Reply]:
    reply = yield Send(method, path, {**ctx.headers, **(headers or {})}, content, timeout)
    if not isinstance(reply, HttpReply | NoReply):
        raise TypeError(f"Send must be answered with a Reply, got {reply!r}")
    return reply


def sleep(seconds: float) -> Steps[None]:
    if seconds > 0:
        yield Sleep(seconds)


class _Run:
    """Mutable state of one drive of one journal entry."""

    def __init__(self, ctx: Context, entry: JournalEntry) -> None:
        self.ctx = ctx
        self.entry = entry
        self.key = entry.key
        self.state = entry.state
        self.attempts = entry.attempts
        self.step = 0
        self.maybe_sent = entry.state is not JournalState.PENDING

    def record(
        self,
        state: JournalState,
        *,
        attempts: int | None = None,
        outcome: Mapping[str, Any] | None = None,
    ) -> Steps[None]:
        yield Record(self.key, state, attempts, outcome)
        self.state = state

    def wait(self, retry_after: float | None, until: float) -> Steps[None]:
        self.step += 1
        seconds = self.ctx.policy.wait(self.step, retry_after, self.ctx.rng)
        yield from sleep(min(seconds, until - self.ctx.clock()))

    def path(self, suffix: str = "") -> str:
        return f"/v1/transactions/{self.key}{suffix}"


def pay(
    ctx: Context, *, key: str, request_json: str, deadline: float, reverse_late_approval: bool
) -> Steps[Transaction]:
    """Journal a new payment (committed before the first send), then drive it."""
    entry = yield Begin(key, request_json, deadline, reverse_late_approval)
    if not isinstance(entry, JournalEntry):
        raise TypeError(f"Begin must be answered with a JournalEntry, got {entry!r}")
    return (yield from drive(ctx, entry, start=Phase.CREATE))


def recover_entry(ctx: Context, entry: JournalEntry) -> Steps[Recovered]:
    """Resolve one unfinished entry: look it up first, whatever its deadline."""
    try:
        transaction = yield from drive(ctx, entry, start=Phase.LOOKUP, lookup_first=True)
    except PaymentAborted as exc:
        return Recovered(entry.key, JournalState.ABORTED, None, exc)
    except PaymentInDoubt as exc:
        return Recovered(entry.key, JournalState.IN_DOUBT, None, exc)
    except APIError as exc:
        return Recovered(entry.key, JournalState.RESOLVED, None, exc)
    return Recovered(entry.key, JournalState.RESOLVED, transaction, None)


def drive(
    ctx: Context, entry: JournalEntry, *, start: Phase, lookup_first: bool = False
) -> Steps[Transaction]:
    """Create / look up until a definitive answer or the deadline, then fence."""
    run = _Run(ctx, entry)
    phase, free_pass = start, lookup_first
    while True:
        remaining = entry.deadline - ctx.clock()
        if remaining < MIN_SEND_S and not free_pass:
            return (yield from _fence(run, cause=None))
        timeout = ctx.timeout if free_pass else min(ctx.timeout, remaining)
        free_pass = False
        if phase is Phase.CREATE:
            run.attempts += 1
            yield from run.record(JournalState.SENT, attempts=run.attempts)
            headers = {
                "Idempotency-Key": run.key,
                "Idempotency-Attempt": str(run.attempts),
                "Content-Type": "application/json",
            }
            reply = yield from send(
                ctx,
                "POST",
                "/v1/transactions",
                timeout=timeout,
                content=entry.request_json,
                headers=headers,
            )
            run.maybe_sent |= not (isinstance(reply, NoReply) and not reply.sent)
        else:
            reply = yield from send(ctx, "GET", run.path(), timeout=timeout)
        action = next_action(phase, reply, now=ctx.now())
        if isinstance(action, Finish):
            return (yield from _finish(run, action))
        if isinstance(action, Fence):
            yield from _fenced(run, action)
        if isinstance(action, Reject):
            yield from _rejected(run, action.error)
        if isinstance(action, GiveUp):
            return (yield from _fence(run, cause=action.error))
        assert isinstance(action, Retry)
        if action.in_doubt and run.state is not JournalState.IN_DOUBT:
            yield from run.record(JournalState.IN_DOUBT)
        yield from run.wait(action.retry_after, entry.deadline)
        phase = action.then


def _fence(run: _Run, *, cause: IdempayError | None) -> Steps[Transaction]:
    """Abort the key: fenced → PaymentAborted; processed → its result; else in doubt."""
    ctx = run.ctx
    if run.state is not JournalState.IN_DOUBT:
        yield from run.record(JournalState.IN_DOUBT)
    grace_end = ctx.clock() + ctx.abort_grace_s
    last = cause
    while (remaining := grace_end - ctx.clock()) >= MIN_SEND_S:
        reply = yield from send(
            ctx, "POST", run.path("/abort"), timeout=min(ctx.timeout, remaining)
        )
        action = next_action(Phase.ABORT, reply, now=ctx.now())
        if isinstance(action, Fence):
            yield from _fenced(run, action)
        if isinstance(action, Finish):
            return (yield from _finish(run, action))
        if isinstance(action, GiveUp | Reject):
            last = action.error
            break
        assert isinstance(action, Retry)
        yield from run.wait(action.retry_after, grace_end)
    if not run.maybe_sent:
        yield from run.record(JournalState.ABORTED, outcome={"kind": "not_sent"})
        raise PaymentAborted(
            f"payment {run.key} was never sent and the deadline passed",
            key=run.key,
            reason="not_sent",
        )
    raise PaymentInDoubt(
        f"payment {run.key}: no definitive answer, not even from abort; "
        "the journal keeps it for recover()",
        key=run.key,
    ) from last


def _finish(run: _Run, action: Finish) -> Steps[Transaction]:
    transaction = action.transaction
    late = run.ctx.clock() >= run.entry.deadline
    if transaction.approved and late and run.entry.reverse_late_approval:
        return (yield from _reverse(run, action))
    yield from run.record(JournalState.RESOLVED, outcome=_outcome(action))
    return transaction


def _reverse(run: _Run, approval: Finish) -> Steps[Transaction]:
    """Reverse an approval that arrived after the customer left (idempotent by id)."""
    ctx = run.ctx
    grace_end = ctx.clock() + ctx.abort_grace_s
    while (remaining := grace_end - ctx.clock()) >= MIN_SEND_S:
        reply = yield from send(
            ctx, "POST", run.path("/reversal"), timeout=min(ctx.timeout, remaining)
        )
        action = next_action(Phase.REVERSAL, reply, now=ctx.now())
        if isinstance(action, Retry):
            yield from run.wait(action.retry_after, grace_end)
            continue
        final = action if isinstance(action, Finish) else approval
        yield from run.record(JournalState.RESOLVED, outcome=_outcome(final))
        return final.transaction
    raise PaymentInDoubt(
        f"payment {run.key} was approved after the deadline and its reversal is not "
        "confirmed; the journal keeps it for recover()",
        key=run.key,
    )


def _fenced(run: _Run, action: Fence) -> Steps[NoReturn]:
    yield from run.record(
        JournalState.ABORTED,
        outcome={"kind": "fenced", "reason": action.reason, "code": action.code},
    )
    raise PaymentAborted(
        f"payment {run.key} was {action.reason}: never charged",
        key=run.key,
        reason=action.reason,
        code=action.code,
        request_id=action.request_id,
    )


def _rejected(run: _Run, error: APIError) -> Steps[NoReturn]:
    outcome = {"kind": "error", "code": error.code, "status": error.status, "detail": error.detail}
    yield from run.record(JournalState.RESOLVED, outcome=outcome)
    raise error


def _outcome(action: Finish) -> dict[str, Any]:
    return {"kind": "transaction", "status": action.transaction.status, "body": action.body}
