"""The payment protocol of contract §4 as a sans-I/O generator (see ``_effects``).

``pay`` journals a new payment (leased to its driver) and drives it; ``recover`` settles
what the journal still owes. ``drive`` runs the create/lookup loop until the deadline, then
``_settle.fence`` aborts (and reverses a late approval when asked). Decisions come from
``_actions.next_action``; waits from ``_retry``; deadlines run on the monotonic clock.

What a 404 lookup ("the server does not know the key") leads to is the run's
``on_not_found``:

- ``resend`` — a payment with its customer waiting: resend with the same key;
- ``wait``   — a later attempt was rejected (408 aside) while an earlier copy may still
  be in flight: that rejection proves nothing about the earlier copy, so keep looking
  up, and abort at the deadline;
- ``fence``  — ``recover()``: no customer is waiting, so never sell; abort now.

Whatever goes wrong after a request may have left — a journal failure, any exception —
ends in ``PaymentInDoubtError`` (with the result when one is known), never a raw error.

Under an offline policy (``Context.offline``) a sale whose attempts all failed to connect —
none may have reached the server — is accepted offline (``_forward.store_offline``): the
journal holds it STORED, and ``recover()`` forwards it first (``_forward.forward_stored``)
instead of fencing it: it is already sold.
"""

from __future__ import annotations

from ._actions import Fence, Finish, GiveUp, Phase, Reject, Retry, next_action
from ._context import Context, Run, send
from ._drive import as_error, driven
from ._effects import Begin, Claim, NoReply, Release, Reply, Steps, Unfinished
from ._exceptions import (
    APIError,
    IdempayError,
    JournalError,
    PaymentAbortedError,
)
from ._forward import forward_stored, store_offline
from ._journal import JournalEntry
from ._models import JournalState, Recovered, Transaction
from ._settle import fence, fenced, finish, rejected

__all__ = ["FENCED_REFUSALS", "Context", "drive", "pay", "recover", "recover_entry"]


def pay(
    ctx: Context,
    *,
    key: str,
    request_json: str,
    deadline_s: float,
    reverse_late_approval: bool,
    owner: str,
) -> Steps[Transaction]:
    """Journal a new payment (committed before the first send), then drive it."""
    deadline = ctx.monotonic() + deadline_s
    wall_deadline = ctx.clock() + deadline_s
    effect = Begin(
        key,
        request_json,
        wall_deadline,
        reverse_late_approval,
        owner,
        wall_deadline + ctx.hold_s,
    )
    try:
        entry = yield effect
    except JournalError:
        raise
    except Exception as exc:
        raise JournalError(f"journal: cannot write payment {key}: {exc}") from exc
    if not isinstance(entry, JournalEntry):
        raise TypeError(f"Begin must be answered with a JournalEntry, got {entry!r}")
    run = Run(ctx, entry, deadline=deadline, on_not_found="resend")
    run.may_store = ctx.offline is not None
    return (yield from driven(run, owner, drive(run, start=Phase.CREATE)))


def recover(ctx: Context, *, owner: str) -> Steps[list[Recovered]]:
    """Forward what was sold offline (in order), then settle every other unfinished entry;
    one that fails does not stop the others."""
    results = yield from forward_stored(ctx, owner=owner)
    keys = yield Unfinished()
    assert isinstance(keys, list)
    for key in keys:
        try:
            recovered = yield from recover_entry(ctx, key, owner=owner)
        except Exception as exc:
            recovered = Recovered(key, JournalState.IN_DOUBT, None, as_error(exc, key))
        if recovered is not None:
            results.append(recovered)
    return results


def recover_entry(ctx: Context, key: str, *, owner: str) -> Steps[Recovered | None]:
    """Take the entry's lease and re-read it; None when another driver holds it or it is
    already settled, or STORED (``forward_stored`` settles those, in order). A never-sent
    entry is fenced; any other is looked up first (whatever its deadline), and fenced if the
    server does not know it — never sent, never resent."""
    entry = yield Claim(key, owner, ctx.clock(), ctx.hold_s)
    if entry is None:
        return None
    assert isinstance(entry, JournalEntry)
    if entry.state.is_terminal:
        return None
    if entry.state is JournalState.STORED:  # sold offline: never fenced
        yield Release(key, owner)
        return None
    deadline = ctx.monotonic() + (entry.deadline - ctx.clock())
    run = Run(ctx, entry, deadline=deadline, on_not_found="fence")
    steps = (
        fence(run, cause=None)
        if entry.state is JournalState.PENDING
        else drive(run, start=Phase.LOOKUP, free_pass=True)
    )
    try:
        transaction = yield from driven(run, owner, steps)
    except PaymentAbortedError as exc:
        return Recovered(key, JournalState.ABORTED, None, exc)
    except APIError as exc:  # settled by another driver with a rejection
        return Recovered(key, JournalState.RESOLVED, None, exc)
    except IdempayError as exc:
        return Recovered(key, JournalState.IN_DOUBT, None, exc)
    return Recovered(key, JournalState.RESOLVED, transaction, None)


FENCED_REFUSALS = frozenset({"clock_skew", "suspected_duplicate"})
"""Refusals of a create that nothing was stored for, yet not the end of the key: a copy of
an attempt could still be processed later, so the SDK fences the key (abort) before it
reports — the abort's answer decides (processed: that result; fenced: the refusal).

- ``clock_skew``: the key's time is ahead of the server's clock; a copy of this very attempt
  (a proxy's retry) would be accepted once the server's clock catches up (model check X2).
- ``suspected_duplicate``: the merchant's duplicate guard refused it; a late copy of an
  earlier attempt of this key would be processed once the earlier transaction has left the
  guard's window. Fenced, it ends ``SuspectedDuplicateError`` (contract §4.13).
"""

LOOKUP_WAIT_S = 8  # Prefer: wait on in-doubt lookups (contract §2.8), at most this long
LOOKUP_WAIT_MARGIN_S = 2  # and this much inside the request's own timeout


def lookup_wait(timeout: float) -> dict[str, str]:
    """``Prefer: wait=N`` for an in-doubt lookup: a key in flight is answered when it settles
    instead of 202 + Retry-After + another lookup (contract §2.8). N stays inside the
    request's timeout (which itself shrinks to the payment's deadline); none below 1 s."""
    seconds = int(min(LOOKUP_WAIT_S, timeout - LOOKUP_WAIT_MARGIN_S))
    return {"Prefer": f"wait={seconds}"} if seconds >= 1 else {}


def drive(run: Run, *, start: Phase, free_pass: bool = False) -> Steps[Transaction]:
    """Create / look up until a definitive answer or the deadline, then fence."""
    ctx = run.ctx
    phase = start
    while True:
        remaining = run.remaining()
        if remaining < ctx.min_send_s and not free_pass:
            if _sells_offline(run, at_deadline=True):
                return (yield from store_offline(run))
            return (yield from fence(run, cause=None))
        timeout = ctx.timeout if free_pass else min(ctx.timeout, remaining)
        free_pass, earlier = False, False
        if phase is Phase.CREATE:
            reply, earlier = yield from _create(run, timeout)
            if isinstance(reply, NoReply):
                run.link_down = run.link_down + 1 if reply.link_down else 0
                if _sells_offline(run):
                    return (yield from store_offline(run))
        else:
            reply = yield from send(
                ctx, "GET", run.path(), timeout=timeout, headers=lookup_wait(timeout)
            )
        action = next_action(phase, reply, now=ctx.now(), expect=run.expect)
        if isinstance(action, Finish):
            return (yield from finish(run, action))
        if isinstance(action, Fence):
            yield from fenced(run, action)
        if isinstance(action, Reject) and action.error.code in FENCED_REFUSALS:
            run.rejection = action.error
            return (yield from fence(run, cause=action.error))
        if isinstance(action, Reject):
            if not earlier:
                yield from rejected(run, action.error)
            run.rejection, run.on_not_found = action.error, "wait"
            action = Retry(Phase.LOOKUP, None, True)
        if isinstance(action, GiveUp):
            return (yield from fence(run, cause=action.error))
        assert isinstance(action, Retry)
        if phase is Phase.LOOKUP and action.then is Phase.CREATE:  # the server has no key
            if run.on_not_found == "fence":
                return (yield from fence(run, cause=None))
            if run.on_not_found == "wait":
                action = Retry(Phase.LOOKUP, None, True)
        if action.in_doubt and run.state is not JournalState.IN_DOUBT:
            yield from run.record(JournalState.IN_DOUBT)
        if not action.now:
            yield from run.wait(action.retry_after, run.deadline)
        phase = action.then


def _sells_offline(run: Run, *, at_deadline: bool = False) -> bool:
    """Accept the payment offline: a sale under an offline policy, no attempt of which may
    have reached the server, whose last ``connect_attempts`` attempts (or, at the deadline,
    its last one) could not connect at all."""
    policy = run.ctx.offline
    if policy is None or not run.may_store or run.maybe_sent or not run.link_down:
        return False
    return at_deadline or run.link_down >= policy.connect_attempts


def _create(run: Run, timeout: float) -> Steps[tuple[Reply, bool]]:
    """One create attempt; also whether an earlier attempt may have reached the server."""
    earlier = run.maybe_sent
    run.attempts += 1
    yield from run.record(JournalState.SENT, attempts=run.attempts)
    headers = {
        "Idempotency-Key": run.key,
        "Idempotency-Attempt": str(run.attempts),
        "Content-Type": "application/json",
    }
    reply = yield from send(
        run.ctx,
        "POST",
        "/v1/transactions",
        timeout=timeout,
        content=run.entry.request_json,
        headers=headers,
    )
    run.maybe_sent |= not (isinstance(reply, NoReply) and not reply.sent)
    return reply, earlier
