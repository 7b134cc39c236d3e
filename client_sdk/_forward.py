"""Store and forward as sans-I/O steps (contract §4.12; the pure pieces are ``_offline``).

``store_offline`` ends a sale that could not reach the server at all: the journal holds it
STORED (or the policy refuses it: ``OfflineLimitError``; or the server would refuse it —
checked by ``_validate`` with the server's own rules — and it ends with the server's error,
``ValidationFailedError``, nothing sent), with the clocks of that moment
(``stamp``: the corrected time, the raw device time, the monotonic time and its epoch,
whether the offset was known). ``forward_stored`` settles what was stored — oldest first,
each under its lease, with the SAME key, as an advice:

- the server's transaction (approved, or declined: ``on_offline_decline``) → RESOLVED;
- 422 ``advice_too_old``, a refusal of its body no resend can change (422
  ``validation_error`` / ``pan_not_allowed``, 413), or the key fenced → REPORTED,
  ``on_offline_error``: never processed, kept for the merchant to reconcile;
- another refusal about this one entry (``clock_skew``, 401, …; the lookup that follows
  finds nothing under the key) → still STORED, and the pass goes on to the next entry: one
  stuck advice never holds back the ones behind it;
- the advice in flight on the server (202, 409 ``request_in_progress``: its issuer has not
  answered) → still STORED (the server finishes it; the next pass looks again), and the
  pass goes on to the next entry;
- the link down, or no definitive answer after the retries → still STORED, and the pass
  stops there (the entries behind it are not tried: they would only wait for the same
  timeouts);
- whatever happened, every stored entry is age-checked: one stored longer than
  ``max_age_s`` is reported once (``StoredPaymentOverdueError``), never dropped. The age is
  the largest of the estimates the entry's stamp allows (``stored_age``), so an entry
  stamped in the future by a clock running ahead cannot dodge it.

**Re-stamp.** An advice refused ``clock_skew`` or ``advice_too_old`` — refusals that store
nothing — whatever its stamp (stamped on the raw device clock, under a UUIDv4 key, or with
an offset that proved wrong) is re-stamped once, when the lookup that follows finds nothing
under the key (404): ``captured_at`` becomes the sale's time on the server's clock, from the
monotonic time recorded at the sale (same monotonic origin only: the boot, or the process
— ``Context.epoch``) and the offset now known; the
journal records the re-stamp (old and new time), then the advice is resent under the same
key. Any other case is reported, never re-stamped.

A forward is settling, not selling: a lost answer is looked up and a 404 resent under the
same key, but a stored key is never aborted — the terminal already sold.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Literal

from ._actions import Fence, Finish, GiveUp, Phase, Reject, Retry, next_action
from ._context import Context, Run, send
from ._drive import driven
from ._effects import Claim, HttpReply, NoReply, Notify, Peek, Release, Steps, Store, Unfinished
from ._exceptions import (
    APIConnectionError,
    APIError,
    IdempayError,
    JournalError,
    OfflineLimitError,
    PayloadTooLargeError,
    PaymentAbortedError,
    StoredPaymentError,
    StoredPaymentOverdueError,
    ValidationFailedError,
)
from ._journal import JournalEntry
from ._models import JournalState, Recovered, Transaction
from ._offline import advice_body, offline_result, stamp_age
from ._validate import refusal

__all__ = ["clock_stamp", "forward_stored", "store_offline", "stored_age"]

STORED = JournalState.STORED


def clock_stamp(ctx: Context) -> dict[str, Any]:
    """The clocks now, as a stored entry keeps them (its age, a re-stamp)."""
    return {
        "server_at": ctx.server_clock(),
        "device_at": ctx.clock(),
        "mono_at": ctx.monotonic(),
        "epoch": ctx.epoch,
        "offset_known": ctx.clock_known(),
    }


def stored_age(ctx: Context, entry: JournalEntry) -> float | None:
    """How long ``entry`` has been stored (``_offline.stamp_age``, as of now)."""
    stamp = (entry.outcome or {}).get("clock")
    captured = entry.request.get("captured_at")
    return stamp_age(stamp if isinstance(stamp, dict) else None, captured, clock_stamp(ctx))


def _captured_at(request_json: str) -> float | None:
    text = json.loads(request_json).get("captured_at")
    if not isinstance(text, str):
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def store_offline(run: Run) -> Steps[Transaction]:
    """Accept the payment offline (no attempt of it reached the server): STORED, durable,
    before its result is returned — or refused by a limit, ended ABORTED (never sent)."""
    ctx, key = run.ctx, run.key
    assert ctx.offline is not None
    advice = advice_body(run.entry.request_json)
    invalid = refusal(advice)
    if invalid is not None:  # the server would refuse it: never sold offline
        yield from _invalid(run, *invalid)
    try:
        stored = yield Store(key, advice, ctx.offline, ctx.server_clock(), clock_stamp(ctx))
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


def _invalid(run: Run, code: str, problems: list[dict[str, Any]]) -> Steps[None]:
    """End a sale the server would refuse (``_validate``) as the server's refusal would
    have: nothing was sent, never charged — the same error a sale online gets."""
    error_type = PayloadTooLargeError if code == "payload_too_large" else ValidationFailedError
    detail = "; ".join(f"{'.'.join(str(part) for part in p['loc'])} {p['msg']}" for p in problems)
    error = error_type(
        f"payment {run.key}: {code}: the server would refuse this sale ({detail}); it was not "
        "sold offline: nothing was sent, never charged",
        code=code,
        detail=detail,
        body={"code": code, "detail": detail, "errors": problems},
    )
    outcome = {"kind": "error", "code": code, "status": None, "detail": detail}
    yield from run.record(JournalState.RESOLVED, outcome=outcome)
    raise error


def forward_stored(ctx: Context, *, owner: str) -> Steps[list[Recovered]]:
    """Forward every STORED entry, oldest first. A refusal about one entry does not stop
    the pass; the link down (or no definitive answer) does: the entries after it are only
    age-checked, and reported STORED with that cause. An entry another driver holds is
    skipped (that driver forwards it)."""
    keys = yield Unfinished(stored_only=True)
    assert isinstance(keys, list)
    results: list[Recovered] = []
    link_down: IdempayError | None = None
    for key in keys:
        forwarded = yield from _forward_entry(ctx, key, owner=owner, link_down=link_down)
        if forwarded is _HELD or forwarded is _SETTLED:
            continue
        assert isinstance(forwarded, tuple)
        recovered, stops = forwarded
        results.append(recovered)
        if stops and link_down is None:
            link_down = recovered.error
    return results


_HELD = "held"
_SETTLED = "settled"


class _EntryRefused(StoredPaymentError):
    """A refusal about this entry alone (its cause): it stays STORED, the pass goes on."""


class _InFlight(StoredPaymentError):
    """The server holds the advice in flight (202, 409 ``request_in_progress``: its issuer
    has not answered): it stays STORED, the server finishes it, and the pass goes on — one
    stuck advice holds back nothing."""


def _forward_entry(
    ctx: Context, key: str, *, owner: str, link_down: IdempayError | None
) -> Steps[tuple[Recovered, bool] | str]:
    """The entry forwarded (or not, and why, and whether that stops the pass); ``_HELD``
    when another driver holds its lease, ``_SETTLED`` when it is no longer stored. With
    ``link_down`` (an earlier entry found the link down) it is not sent, only age-checked."""
    entry = yield Claim(key, owner, ctx.clock(), ctx.hold_s)
    if entry is None:
        return _HELD
    assert isinstance(entry, JournalEntry)
    if entry.state is not STORED:  # settled meanwhile
        if not entry.state.is_terminal:
            yield Release(key, owner)
        return _SETTLED
    run = Run(ctx, entry, deadline=ctx.monotonic() + ctx.hold_s / 2, on_not_found="resend")
    steps = _forwarding(run) if link_down is None else _not_sent(run, link_down)
    try:
        transaction = yield from driven(run, owner, steps)
    except IdempayError as exc:
        now = yield Peek(key)
        state = now.state if isinstance(now, JournalEntry) else run.state
        return Recovered(key, state, None, exc), run.link_down > 0
    return Recovered(key, JournalState.RESOLVED, transaction, None), False


def _public(error: IdempayError) -> IdempayError:
    """A per-entry refusal is reported as the server's error itself."""
    if isinstance(error, _EntryRefused) and isinstance(error.__cause__, IdempayError):
        return error.__cause__
    return error


def _not_sent(run: Run, cause: IdempayError) -> Steps[Transaction]:
    """Not forwarded in this pass (the link is down): only its age is checked."""
    run.link_down = 1
    raise (yield from _overdue(run, cause))


def _forwarding(run: Run) -> Steps[Transaction]:
    try:
        return (yield from _advise(run))
    except IdempayError as exc:
        # the link down, or no definitive answer after the retries: the pass stops here
        run.link_down = int(isinstance(exc, APIConnectionError) or type(exc) is StoredPaymentError)
        error = _public(exc)
        if run.state is STORED:
            error = yield from _overdue(run, error)
        raise error from error.__cause__


def _advise(run: Run) -> Steps[Transaction]:
    """Send the advice until a definitive answer, the link down, or the retries spent."""
    ctx = run.ctx
    phase, sends, last = Phase.CREATE, 0, None
    refused: APIError | None = None  # this attempt's refusal, until the lookup says more
    restamped = False
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
        if _in_flight(reply):  # the link answers: go on to the next entry
            raise _InFlight(
                f"stored payment {run.key}: the server is still processing it (its issuer "
                "has not answered); it stays stored and is looked up again at the next pass",
                key=run.key,
            )
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
        if isinstance(action, GiveUp):
            raise action.error
        if isinstance(action, Reject):  # what does the server hold under the key?
            last, refused, phase = action.error, action.error, Phase.LOOKUP
            continue
        assert isinstance(action, Retry)
        if phase is Phase.LOOKUP and action.then is Phase.CREATE:  # 404: nothing under the key
            if refused is None:  # a lost answer: resend the advice
                phase = Phase.CREATE
                continue
            # This attempt was refused and the server holds nothing under the key: the
            # refusal is about this entry (never processed so far).
            if refused.code in _RESTAMPED and not restamped and (yield from _restamp(run)):
                # a new body under the same key: its own sends (this happens once)
                restamped, refused, phase, sends = True, None, Phase.CREATE, 0
                continue
            if refused.code in _REFUSED_FOR_GOOD:
                yield from _refused(run, refused, _error_outcome(refused))
            raise _EntryRefused(
                f"stored payment {run.key}: refused ({refused}); it stays stored and is "
                "forwarded again",
                key=run.key,
            ) from refused
        refused = None
        yield from run.wait(action.retry_after, run.deadline)
        phase = action.then
    raise StoredPaymentError(
        f"stored payment {run.key}: no definitive answer yet ({last or 'in doubt'}); it "
        "stays stored and is forwarded again",
        key=run.key,
    ) from last


def _in_flight(reply: HttpReply | NoReply) -> bool:
    """An answer saying the key is being processed now (not a lost answer, not a 5xx)."""
    if not isinstance(reply, HttpReply):
        return False
    code = reply.body.get("code") if isinstance(reply.body, dict) else None
    return reply.status == 202 or (reply.status == 409 and code == "request_in_progress")


_REFUSED_FOR_GOOD = frozenset(
    {"advice_too_old", "validation_error", "pan_not_allowed", "payload_too_large"}
)
"""Refusals of an advice that no resend can change (its age, its body): once the lookup
shows nothing under the key, the entry ends REPORTED, never STORED forever."""

RESTAMP_MIN_S = 1.0
"""A re-stamp that would move ``captured_at`` less than this is not one: the time was
right, and the refusal stands."""
_RESTAMPED = frozenset({"clock_skew", "advice_too_old"})
"""Refusals of an advice that store nothing, caused by its time alone."""


def _restamp(run: Run) -> Steps[bool]:
    """Re-stamp ``captured_at`` of a refused advice now that the offset is known (whatever
    its stamp said: the raw device clock, or an offset that proved wrong — the re-stamp
    does not rely on it): the sale's time on the server's clock is
    now minus the monotonic time elapsed since the sale — only on the monotonic origin
    that recorded it (``Context.epoch``: the boot, or the process; another boot's monotonic
    time means nothing). Journaled (old and new time) before it is sent; False when it
    cannot be proven, or was done already."""
    ctx = run.ctx
    outcome = dict(run.entry.outcome or {})
    stamp = outcome.get("clock")
    if not isinstance(stamp, dict) or "restamped" in outcome:
        return False
    if stamp.get("epoch") != ctx.epoch or not ctx.clock_known():
        return False
    mono_at = stamp.get("mono_at")
    if not isinstance(mono_at, int | float):
        return False
    sold_at = ctx.server_clock() - (ctx.monotonic() - float(mono_at))
    body: dict[str, Any] = json.loads(run.entry.request_json)
    was = _captured_at(run.entry.request_json)
    if was is not None and abs(sold_at - was) < RESTAMP_MIN_S:  # the time was right
        return False
    captured = datetime.fromtimestamp(sold_at, UTC).isoformat(timespec="milliseconds")
    captured = captured.replace("+00:00", "Z")
    restamp = {"from": body.get("captured_at"), "to": captured}
    body["captured_at"] = captured
    request_json = json.dumps(body, separators=(",", ":"), sort_keys=True)
    outcome["restamped"] = restamp
    yield from run.record(STORED, outcome=outcome, request_json=request_json)
    run.entry = replace(run.entry, request_json=request_json, outcome=outcome)
    return True


def _forwarded(run: Run, action: Finish) -> Steps[Transaction]:
    transaction = action.transaction
    outcome = {"kind": "transaction", "status": transaction.status, "body": action.body}
    outcome.update(_kept(run))
    yield from run.record(JournalState.RESOLVED, outcome=outcome, result=transaction)
    if transaction.status == "declined":
        yield from _notify("offline_decline", transaction)
    return transaction


def _kept(run: Run) -> dict[str, Any]:
    """What a stored entry's final outcome keeps of its stored one: its clocks and its
    re-stamp (the journal's record of what was sent, and why)."""
    stored = run.entry.outcome or {}
    return {name: stored[name] for name in ("clock", "restamped") if name in stored}


def _refused(run: Run, error: IdempayError, outcome: dict[str, Any]) -> Steps[None]:
    yield from run.record(JournalState.REPORTED, outcome={**outcome, **_kept(run)})
    yield from _notify("offline_error", error)
    raise error


def _overdue(run: Run, cause: IdempayError) -> Steps[IdempayError]:
    """``cause``, or — stored longer than ``max_age_s`` — ``StoredPaymentOverdueError``
    (told to the application once: the journal remembers it was)."""
    policy = run.ctx.offline
    age = stored_age(run.ctx, run.entry)
    if policy is None or age is None or age <= policy.max_age_s:
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
