"""Store and forward as sans-I/O steps (contract §4.12; the pure pieces are ``_offline``).

``store_offline`` ends a sale that could not reach the server at all: the journal holds it
STORED (or the policy refuses it: ``OfflineLimitError``). ``forward_stored`` settles what
was stored — oldest first, each under its lease, with the SAME key, as an advice:

- the server's transaction (approved, or declined: ``on_offline_decline``) → RESOLVED;
- 422 ``advice_too_old``, or the key fenced → REPORTED, ``on_offline_error``: never
  processed, kept for the merchant to reconcile;
- anything else (the link still down, no definitive answer yet) → still STORED, and the
  pass stops there so that the order is kept; a payment stored longer than ``max_age_s``
  is reported once (``StoredPaymentOverdueError``), never dropped.

A forward is settling, not selling: a lost answer is looked up and a 404 resent under the
same key, but a stored key is never aborted — the terminal already sold.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from ._actions import Fence, Finish, GiveUp, Phase, Reject, Retry, next_action
from ._context import Context, Run, send
from ._drive import driven
from ._effects import Claim, NoReply, Notify, Peek, Release, Steps, Store, Unfinished
from ._exceptions import (
    APIConnectionError,
    IdempayError,
    JournalError,
    OfflineLimitError,
    PaymentAbortedError,
    StoredPaymentError,
    StoredPaymentOverdueError,
)
from ._journal import JournalEntry
from ._models import JournalState, Recovered, Transaction
from ._offline import advice_body, offline_result

__all__ = ["forward_stored", "store_offline"]

STORED = JournalState.STORED


def store_offline(run: Run) -> Steps[Transaction]:
    """Accept the payment offline (no attempt of it reached the server): STORED, durable,
    before its result is returned — or refused by a limit, ended ABORTED (never sent)."""
    ctx, key = run.ctx, run.key
    assert ctx.offline is not None
    advice = advice_body(run.entry.request_json)
    try:
        stored = yield Store(key, advice, ctx.offline, ctx.server_clock())
    except JournalError:
        raise
    except Exception as exc:
        raise JournalError(f"payment {key}: nothing was sent; journal failed: {exc}") from exc
    if isinstance(stored, str):
        yield from run.record(
            JournalState.ABORTED, outcome={"kind": "offline_refused", "limit": stored}
        )
        raise OfflineLimitError(
            f"payment {key}: the server cannot be reached and the offline policy refuses "
            f"it ({stored}); nothing was sent, never charged",
            key=key,
            limit=stored,
        )
    run.state = STORED
    return offline_result(key, advice)


def forward_stored(ctx: Context, *, owner: str) -> Steps[list[Recovered]]:
    """Forward every STORED entry, oldest first; stop at the first one not forwarded now
    (the ones after it are reported with the same cause) or held by another driver."""
    keys = yield Unfinished(stored_only=True)
    assert isinstance(keys, list)
    results: list[Recovered] = []
    for index, key in enumerate(keys):
        recovered = yield from _forward_entry(ctx, key, owner=owner)
        if recovered is _HELD:  # another driver is forwarding it: it keeps the order
            break
        if recovered is _SETTLED:  # another driver forwarded it since we listed the keys
            continue
        assert isinstance(recovered, Recovered)
        results.append(recovered)
        if recovered.state is STORED:
            cause = recovered.error
            results += [Recovered(later, STORED, None, cause) for later in keys[index + 1 :]]
            break
    return results


_HELD = "held"
_SETTLED = "settled"


def _forward_entry(ctx: Context, key: str, *, owner: str) -> Steps[Recovered | str]:
    """The entry forwarded (or not, and why); ``_HELD`` when another driver holds its
    lease, ``_SETTLED`` when it is no longer stored."""
    entry = yield Claim(key, owner, ctx.clock(), ctx.hold_s)
    if entry is None:
        return _HELD
    assert isinstance(entry, JournalEntry)
    if entry.state is not STORED:  # settled meanwhile
        if not entry.state.is_terminal:
            yield Release(key, owner)
        return _SETTLED
    run = Run(ctx, entry, deadline=ctx.monotonic() + ctx.hold_s / 2, on_not_found="resend")
    try:
        transaction = yield from driven(run, owner, _forwarding(run))
    except IdempayError as exc:
        now = yield Peek(key)
        state = now.state if isinstance(now, JournalEntry) else run.state
        return Recovered(key, state, None, exc)
    return Recovered(key, JournalState.RESOLVED, transaction, None)


def _forwarding(run: Run) -> Steps[Transaction]:
    try:
        return (yield from _advise(run))
    except IdempayError as exc:
        if run.state is STORED:
            raise (yield from _overdue(run, exc)) from exc
        raise


def _advise(run: Run) -> Steps[Transaction]:
    """Send the advice until a definitive answer, the link down, or the retries spent."""
    ctx = run.ctx
    phase, sends, last = Phase.CREATE, 0, None
    while sends <= ctx.policy.max_retries and run.remaining() >= ctx.min_send_s:
        sends += 1
        if phase is Phase.CREATE:
            run.attempts += 1
            yield from run.record(STORED, attempts=run.attempts)
            headers = {
                "Idempotency-Key": run.key,
                "Idempotency-Attempt": str(run.attempts),
                "Content-Type": "application/json",
            }
            reply = yield from send(
                ctx,
                "POST",
                "/v1/transactions",
                timeout=ctx.timeout,
                content=run.entry.request_json,
                headers=headers,
            )
        else:
            reply = yield from send(ctx, "GET", run.path(), timeout=ctx.timeout)
        if isinstance(reply, NoReply) and not reply.sent:  # still offline: try later
            raise APIConnectionError(f"{run.key}: {reply.error}", sent=False)
        action = next_action(phase, reply, now=ctx.now(), expect=run.expect)
        if isinstance(action, Finish):
            return (yield from _forwarded(run, action))
        if isinstance(action, Fence):
            error = PaymentAbortedError(
                f"stored payment {run.key} was {action.reason} by the server: it will never "
                "be processed; reconcile it",
                key=run.key,
                reason=action.reason,
                code=action.code,
            )
            yield from _refused(run, error, {"kind": "fenced", "reason": action.reason})
        if isinstance(action, Reject) and action.error.code == "advice_too_old":
            yield from _refused(run, action.error, _error_outcome(action.error))
        if isinstance(action, GiveUp):
            raise action.error
        if isinstance(action, Reject):  # what does the server hold under the key?
            last, phase = action.error, Phase.LOOKUP
            continue
        assert isinstance(action, Retry)
        if phase is Phase.LOOKUP and action.then is Phase.CREATE:  # 404: resend the advice
            phase = Phase.CREATE
            continue
        yield from run.wait(action.retry_after, run.deadline)
        phase = action.then
    raise StoredPaymentError(
        f"stored payment {run.key}: no definitive answer yet ({last or 'in doubt'}); it "
        "stays stored and is forwarded again",
        key=run.key,
    ) from last


def _forwarded(run: Run, action: Finish) -> Steps[Transaction]:
    transaction = action.transaction
    outcome = {"kind": "transaction", "status": transaction.status, "body": action.body}
    yield from run.record(JournalState.RESOLVED, outcome=outcome, result=transaction)
    if transaction.status == "declined":
        yield from _notify("offline_decline", transaction)
    return transaction


def _refused(run: Run, error: IdempayError, outcome: dict[str, Any]) -> Steps[None]:
    yield from run.record(JournalState.REPORTED, outcome=outcome)
    yield from _notify("offline_error", error)
    raise error


def _overdue(run: Run, cause: IdempayError) -> Steps[IdempayError]:
    """``cause``, or — stored longer than ``max_age_s`` — ``StoredPaymentOverdueError``
    (told to the application once: the journal remembers it was)."""
    policy = run.ctx.offline
    captured = json.loads(run.entry.request_json).get("captured_at")
    if policy is None or not isinstance(captured, str):
        return cause
    age = (
        run.ctx.server_clock() - datetime.fromisoformat(captured.replace("Z", "+00:00")).timestamp()
    )
    if age <= policy.max_age_s:
        return cause
    error = StoredPaymentOverdueError(
        f"stored payment {run.key} is {age:.0f} s old (max_age_s {policy.max_age_s:g}) and "
        f"still not forwarded ({cause}); it stays stored",
        key=run.key,
        age_s=age,
    )
    error.__cause__ = cause
    outcome = dict(run.entry.outcome or {})
    if not outcome.get("overdue_reported"):
        yield from run.record(STORED, outcome={**outcome, "overdue_reported": True})
        yield from _notify("offline_error", error)
    return error


def _notify(kind: Literal["offline_decline", "offline_error"], payload: object) -> Steps[None]:
    try:
        yield Notify(kind, payload)
    except Exception:  # noqa: BLE001 - the application's callback failing changes nothing here
        return


def _error_outcome(error: IdempayError) -> dict[str, Any]:
    return {"kind": "error", "code": error.code, "status": error.status, "detail": error.detail}
