"""What ``Client`` and ``AsyncClient`` share: one constructor (configuration, validated),
the journal, one definition of a payment's arguments (``PaymentArgs``, ``PurchaseArgs``)
and building its steps, and translating between httpx and the protocol's replies.

Times the server judges — ``captured_at``, ``expires_at`` and the UUIDv7 key's time — are
taken from the device clock corrected by the offset learned from ``Date`` headers, so a
terminal whose clock is days off still sells. An offset describes one clock: it is used only
while the device clock keeps its relation to the boot clock it was learned against (a step —
NTP, the operator, an RTC reset — or a reboot drops it until the server is heard again)."""

from __future__ import annotations

import math
import os
import random
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, Literal, TypedDict, TypeVar

import httpx

from ._calls import transactions
from ._context import Context
from ._effects import (
    Begin,
    Claim,
    HttpReply,
    JournalEffect,
    NoReply,
    Notify,
    Peek,
    Record,
    Release,
    Send,
    Steps,
    Store,
)
from ._exceptions import IdempayError, UnauthorizedError
from ._forward import forward_stored
from ._journal import Journal, KeptClock, new_owner
from ._keys import uuid7
from ._models import Card, Recovered, Transaction, card_from
from ._offline import OfflinePolicy
from ._protocol import pay, recover
from ._request import build_body
from ._retry import RetryPolicy, parse_http_date

__all__ = [
    "MAX_DEADLINE_S",
    "NETWORKS",
    "BaseClient",
    "OfflineDeclineHandler",
    "OfflineErrorHandler",
    "PaymentArgs",
    "PaymentKind",
    "PurchaseArgs",
    "no_reply",
    "reply_from",
    "check_payment",
    "retry_policy",
]

MAX_DEADLINE_S = 3600.0
"""A payment deadline longer than an hour is a bug in the caller, not a customer waiting."""
DEFAULT_DEADLINE_S = 60.0
PaymentKind = Literal["purchase", "refund"]

_TransportT = TypeVar("_TransportT")  # httpx.BaseTransport, or httpx.AsyncBaseTransport
_SleepT = TypeVar("_SleepT")  # a blocking sleep, or an awaitable one

NETWORKS = frozenset({"gprs", "3g", "4g", "wifi", "ethernet", "other"})
# The server's Date header has a resolution of one second: a smaller offset is noise.
CLOCK_SKEW_TOLERANCE_S = 2.0
CLOCK_KEEP_STEP_S = 1.0  # the journal's copy of the offset is rewritten when it moved this much
CLOCK_STEP_TOLERANCE_S = 5.0
"""The device clock moved against the boot clock by more than this since the offset was
learned: the clock was stepped (NTP, the operator, an RTC reset), and the offset, learned for
the clock before the step, is dropped (contract §4.11)."""
LINK_DOWN_CONNECT_S = 2.0
"""While the link is known down, a request gets this long (at most its timeout) to connect:
a connect timeout is certain to have sent nothing, so a sale still never becomes offline
once it may have reached the server — it only stops paying a full timeout per attempt."""
LINK_DOWN_MEMORY_S = 60.0
"""How long a full-length connect failure keeps the link known down (short connects that
fail do not extend it: a link slower than ``LINK_DOWN_CONNECT_S`` is retried at full length)."""
PROCESS_EPOCH = uuid.uuid4().hex  # this process's monotonic clock (Context.epoch)
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def monotonic_epoch(monotonic: Callable[[], float] | None) -> str:
    """What names the monotonic clock's origin (``Context.epoch``): with the default
    ``time.monotonic`` on Linux (CLOCK_MONOTONIC: one origin per boot, shared by every
    process), the kernel's boot id — so a payment stored by an earlier process of the same
    boot can still be re-stamped; otherwise (another platform, an injected clock) this
    process alone."""
    if monotonic is not None and monotonic is not time.monotonic:
        return f"process:{PROCESS_EPOCH}"
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as source:
            boot = source.read().strip()
    except OSError:
        boot = ""
    return f"boot:{boot}" if boot else f"process:{PROCESS_EPOCH}"


def boot_clock(monotonic: Callable[[], float] | None) -> Callable[[], float]:
    """The clock an offset's device clock is compared with: an injected monotonic clock
    as is; else the boot clock (Linux ``CLOCK_BOOTTIME``: it counts suspend, so only a
    step of the device clock moves the difference), else ``time.monotonic``."""
    if monotonic is not None and monotonic is not time.monotonic:
        return monotonic
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        try:
            time.clock_gettime(boottime)
        except OSError:
            return time.monotonic
        return lambda: time.clock_gettime(boottime)
    return time.monotonic


MAX_CLOCK_SAMPLE_RTT_S = 2.0  # a slower round trip says too little about the server's clock
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
# No connection to the server could be made at all (refused, no route, DNS, connect timeout):
# not a busy pool (PoolTimeout) nor a misconfigured URL (UnsupportedProtocol).
_LINK_DOWN = (httpx.ConnectError, httpx.ConnectTimeout)
OfflineDeclineHandler = Callable[[Transaction], object]
"""``on_offline_decline``: called with the issuer's decline of a forwarded offline payment."""
OfflineErrorHandler = Callable[[IdempayError], object]
"""``on_offline_error``: called with ``AdviceTooOldError``, ``StoredPaymentOverdueError``, the
server's refusal of a stored advice's body (``ValidationFailedError``, ``PayloadTooLargeError``)
or the ``PaymentAbortedError`` of a fenced key — a stored payment the merchant must
reconcile."""


def reply_from(response: httpx.Response) -> HttpReply:
    try:
        body: object = response.json()
    except ValueError:
        body = None
    headers = {name.lower(): value for name, value in response.headers.items()}
    return HttpReply(response.status_code, headers, body)


def no_reply(exc: Exception) -> NoReply:
    """Connect errors certainly happened before sending; anything else — a transport
    error, a mangled body (``httpx.DecodingError``), a closed event loop — is in doubt."""
    return NoReply(
        sent=not isinstance(exc, _NOT_SENT),
        error=f"{type(exc).__name__}: {exc}",
        link_down=isinstance(exc, _LINK_DOWN),
    )


def _check_number(name: str, value: float, *, low: float, high: float, low_ok: bool) -> None:
    valid = isinstance(value, int | float) and not isinstance(value, bool)
    valid = valid and math.isfinite(value) and value <= high
    valid = valid and (value >= low if low_ok else value > low)
    if not valid:
        bound = "≥" if low_ok else ">"
        raise ValueError(f"{name} must be a finite number {bound} {low} and ≤ {high}: {value!r}")


def check_deadline(deadline_s: float) -> None:
    """A payment's deadline: finite, positive and sane, checked before anything happens."""
    _check_number("deadline_s", deadline_s, low=0.0, high=MAX_DEADLINE_S, low_ok=False)


def check_payment(kind: PaymentKind, args: PaymentArgs) -> None:
    """A payment's arguments, checked before anything happens: the keywords ``PaymentArgs``
    names (a ``TypeError`` otherwise, as for any signature) and a sane deadline."""
    missing = PaymentArgs.__required_keys__ - args.keys()
    if missing:
        raise TypeError(f"{kind}() missing keyword arguments: {', '.join(sorted(missing))}")
    unknown = args.keys() - PaymentArgs.__required_keys__ - PaymentArgs.__optional_keys__
    if unknown:
        raise TypeError(f"{kind}() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    check_deadline(args.get("deadline_s", DEFAULT_DEADLINE_S))


def send_kwargs(effect: Send) -> dict[str, Any]:
    return {"headers": dict(effect.headers), "content": effect.content, "timeout": effect.timeout}


def retry_policy(
    retry: RetryPolicy | None,
    *,
    base_backoff: float | None,
    max_backoff: float | None,
    max_retries: int | None,
) -> RetryPolicy:
    """``retry``, or a policy built from the deprecated loose arguments (with a
    ``DeprecationWarning``); passing both is a ``TypeError``."""
    loose = {
        name: value
        for name, value in (
            ("base_backoff", base_backoff),
            ("max_backoff", max_backoff),
            ("max_retries", max_retries),
        )
        if value is not None
    }
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
    if not loose:
        return retry if retry is not None else RetryPolicy()
    names = ", ".join(loose)
    if retry is not None:
        raise TypeError(f"pass retry=RetryPolicy(...) or the deprecated {names}, not both")
    warnings.warn(
        f"{names}: deprecated, removed in the next release; pass "
        "retry=RetryPolicy(base=..., cap=..., max_retries=...) instead",
        DeprecationWarning,
        stacklevel=3,  # the caller of Client(...) / AsyncClient(...)
    )
    default = RetryPolicy()
    if base_backoff is not None:
        _check_number("base_backoff", base_backoff, low=0.0, high=600.0, low_ok=True)
    if max_backoff is not None:
        _check_number("max_backoff", max_backoff, low=0.0, high=600.0, low_ok=True)
    if max_retries is not None and (not isinstance(max_retries, int) or max_retries < 0):
        raise ValueError("max_retries must be an integer ≥ 0")
    return RetryPolicy(
        base=default.base if base_backoff is None else base_backoff,
        cap=default.cap if max_backoff is None else max_backoff,
        max_retries=default.max_retries if max_retries is None else max_retries,
    )


class _RequiredPaymentArgs(TypedDict):
    amount: int
    currency: str
    card: Card | Mapping[str, str]


class PaymentArgs(_RequiredPaymentArgs, total=False):
    """The arguments of ``purchase`` and ``refund`` (keyword-only, in both clients), defined
    once; ``BaseClient._payment`` applies the defaults.

    - ``amount`` (required): minor units of ``currency`` (1250 BRL = R$ 12.50).
    - ``currency`` (required): ISO 4217, three upper-case letters.
    - ``card`` (required): a ``Card`` or a ``{"token", "last4", "brand"}`` mapping.
    - ``deadline_s``: seconds the customer waits (default 60); at the deadline the key is
      aborted.
    - ``installments``, ``metadata``: sent when given (default None).
    - ``captured_at``: the sale's time (default: now, on the server's clock as learned).
    - ``reverse_late_approval``: reverse an approval that lands after the deadline (default
      False).
    """

    deadline_s: float
    installments: int | None
    metadata: Mapping[str, Any] | None
    captured_at: datetime | None
    reverse_late_approval: bool


class PurchaseArgs(PaymentArgs, total=False):
    """``PaymentArgs`` plus ``allow_duplicate`` (default False): the cashier confirmed a
    sale the merchant's duplicate guard refused (``SuspectedDuplicateError``) — a NEW
    payment under a new key, sent with ``"allow_duplicate": true`` (contract §2.2, §4.13)."""

    allow_duplicate: bool


class BaseClient(Generic[_TransportT, _SleepT]):
    """What ``Client`` and ``AsyncClient`` share: one constructor (the arguments are
    documented on ``Client``), the journal, building a payment's steps, and translating
    between httpx and the protocol. A client adds only its HTTP client and sleep
    (``_connect``) and how it runs the steps (blocking, or awaited)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        terminal_id: str,
        journal: str | os.PathLike[str] | Journal = "pos.db",
        network: str | None = None,
        timeout: float = 10.0,
        transport: _TransportT | None = None,
        retry: RetryPolicy | None = None,
        abort_grace_s: float = 15.0,
        send_expires_at: bool = True,
        seed: int | None = None,
        clock: Callable[[], float] | None = None,
        monotonic: Callable[[], float] | None = None,
        sleep: _SleepT | None = None,
        base_backoff: float | None = None,
        max_backoff: float | None = None,
        max_retries: int | None = None,
        offline: OfflinePolicy | None = None,
        on_offline_decline: OfflineDeclineHandler | None = None,
        on_offline_error: OfflineErrorHandler | None = None,
    ) -> None:
        policy = retry_policy(
            retry, base_backoff=base_backoff, max_backoff=max_backoff, max_retries=max_retries
        )
        if offline is not None and not isinstance(offline, OfflinePolicy):
            raise TypeError(f"offline must be an OfflinePolicy, not {type(offline).__name__}")
        if network is not None and network not in NETWORKS:
            raise ValueError(f"network must be one of {sorted(NETWORKS)}")
        _check_number("timeout", timeout, low=0.0, high=600.0, low_ok=False)
        _check_number("abort_grace_s", abort_grace_s, low=0.0, high=MAX_DEADLINE_S, low_ok=True)
        headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}
        self._api_key = api_key  # named (by its first characters) in a 401's message
        if network is not None:
            headers["POS-Network"] = network
        self.terminal_id = terminal_id
        self.retry = policy
        self.send_expires_at = send_expires_at
        self.offline = offline
        self.on_offline_decline = on_offline_decline
        self.on_offline_error = on_offline_error
        self._owns_journal = not isinstance(journal, Journal)
        self.journal = journal if isinstance(journal, Journal) else Journal(journal)
        self.clock_offset_s: float | None = None  # server clock − ours, from Date headers
        self._offset_reference: float | None = None  # device − boot clock when it was learned
        self._boot_clock = boot_clock(monotonic)
        self._kept: KeptClock | None = None  # the offset the journal holds
        self._clock_asked = False  # the server was asked its time once (before a payment)
        self._link_down_at: float | None = None  # monotonic: a full connect failed then
        self._ctx = Context(
            headers=headers,
            timeout=timeout,
            policy=policy,
            abort_grace_s=abort_grace_s,
            clock=clock or time.time,
            monotonic=monotonic or time.monotonic,
            server_clock=self._server_clock,
            rng=random.Random(seed),
            offline=offline,
            clock_known=lambda: self._current_offset() is not None,
            epoch=monotonic_epoch(monotonic),
        )
        self._inherit_clock()
        self._connect(base_url, transport=transport, timeout=timeout, sleep=sleep)

    def _clock_relation(self) -> float:
        """The device clock minus the boot clock: constant until the device clock steps."""
        return self._ctx.clock() - self._boot_clock()

    def _same_clock(self, reference: float | None) -> bool:
        return (
            reference is not None
            and abs(self._clock_relation() - reference) <= CLOCK_STEP_TOLERANCE_S
        )

    def _inherit_clock(self) -> None:
        """The offset an earlier process of this boot learned (journal), so a terminal whose
        app restarts while offline still stamps corrected times — only for the same clock:
        the same boot, the device clock not stepped since (its relation to the boot clock
        unchanged) and not earlier than when it was learned. Otherwise (a reboot, an NTP
        step, an RTC reset) that offset described another clock: the clock stays unknown
        until the server is heard (contract §4.11)."""
        try:
            kept = self.journal.kept_clock()
        except Exception:  # noqa: BLE001 - best effort: the clock stays unknown
            return
        if kept is None:
            return
        self._kept = kept
        if kept.epoch != self._ctx.epoch or not self._same_clock(kept.reference):
            return
        if self._ctx.clock() >= kept.device_at - CLOCK_SKEW_TOLERANCE_S:
            self.clock_offset_s = kept.offset_s
            self._offset_reference = kept.reference

    def _current_offset(self) -> float | None:
        """The learned offset, while the device clock is still the one it was learned for;
        after a step it is dropped, and the next payment asks the server its time again
        (a sale before that is stamped on the raw device clock, under a UUIDv4 key)."""
        offset = self.clock_offset_s
        if offset is None or self._same_clock(self._offset_reference):
            return offset
        self.clock_offset_s = None
        self._offset_reference = None
        self._clock_asked = False
        return None

    def _keep_clock(self, offset: float, device_at: float, reference: float) -> None:
        """Persist a newly learned offset when it (or the clock it describes) moved: one
        small write, not one per answer. Best effort: a journal failure here changes no
        payment."""
        kept, epoch = self._kept, self._ctx.epoch
        if (
            kept is not None
            and abs(kept.offset_s - offset) < CLOCK_KEEP_STEP_S
            and kept.epoch == epoch
            and kept.reference is not None
            and abs(kept.reference - reference) <= CLOCK_STEP_TOLERANCE_S
        ):
            return
        try:
            self.journal.save_clock_offset(
                offset, device_at=device_at, reference=reference, epoch=epoch
            )
        except Exception:  # noqa: BLE001 - the in-memory offset still corrects this process
            return
        self._kept = KeptClock(offset, device_at, reference, epoch)

    def _name_key(self, exc: BaseException) -> None:
        """A 401 raised to the caller says which ``api_key`` the server refused."""
        if isinstance(exc, UnauthorizedError):
            exc._name_key(self._api_key)

    def _connect(
        self, base_url: str, *, transport: _TransportT | None, timeout: float, sleep: _SleepT | None
    ) -> None:
        """Open this client's HTTP client (``self._http``) and choose its sleep."""
        raise NotImplementedError

    @property
    def max_retries(self) -> int:
        """Deprecated: ``retry.max_retries``."""
        return self.retry.max_retries

    def _observe_clock(self, response: httpx.Response, sent_at: float) -> None:
        """Estimate how far the server's clock is from ours, NTP-style, so that
        ``expires_at`` — a deadline the server compares with its own clock — survives a
        terminal whose clock is off: the ``Date`` header (truncated to the second: +0.5 s)
        against the middle of the round trip. Only quick round trips count: an answer the
        network held for seconds would skew the estimate by as much."""
        date = response.headers.get("date")
        if not date or "x-request-id" not in response.headers:
            return  # only idempay's own answers: a proxy's error page may carry any Date
        received_at = self._ctx.clock()
        if not 0 <= received_at - sent_at <= MAX_CLOCK_SAMPLE_RTT_S:
            return
        when = parse_http_date(date)
        if when is None:
            return
        try:
            server = when.timestamp() + 0.5
        except (ValueError, OverflowError):  # a year-1 date with a positive offset
            return
        self.clock_offset_s = server - (sent_at + received_at) / 2
        self._offset_reference = self._clock_relation()
        self._keep_clock(self.clock_offset_s, received_at, self._offset_reference)

    def link_known_down(self) -> bool:
        """Whether a request's connect timed out (its full timeout) within the last
        ``LINK_DOWN_MEMORY_S``, with no answer since: a link that drops packets."""
        down = self._link_down_at
        return down is not None and self._ctx.monotonic() - down < LINK_DOWN_MEMORY_S

    def _timeout_for(self, timeout: float) -> float | httpx.Timeout:
        """A request's timeout: the full one, or — the link known down — a short connect
        (reading an answer once connected still gets the full timeout)."""
        if not self.link_known_down():
            return timeout
        return httpx.Timeout(timeout, connect=min(timeout, LINK_DOWN_CONNECT_S))

    def _note_link(self, failure: Exception | None, *, short: bool) -> None:
        """An answer (``failure`` None): the link is up. A connect that timed out with the
        full timeout: down. A connection refused (no route, DNS) costs no time: it changes
        nothing here — the next request finds out as quickly."""
        if failure is None:
            self._link_down_at = None
        elif isinstance(failure, httpx.ConnectTimeout) and not short:
            self._link_down_at = self._ctx.monotonic()

    def _server_now(self, local: float) -> float:
        offset = self._current_offset()
        if offset is None or abs(offset) < CLOCK_SKEW_TOLERANCE_S:
            return local
        return local + offset

    def _server_clock(self) -> float:
        return self._server_now(self._ctx.clock())

    def _payment(
        self, kind: PaymentKind, args: PaymentArgs, *, allow_duplicate: bool = False
    ) -> tuple[str, Steps[Transaction]]:
        """Mint the key once and build the steps; nothing is written or sent yet."""
        deadline_s = args.get("deadline_s", DEFAULT_DEADLINE_S)
        check_deadline(deadline_s)
        server_started = self._server_clock()
        server_now = datetime.fromtimestamp(server_started, UTC)
        expires = server_now + timedelta(seconds=deadline_s) if self.send_expires_at else None
        body = build_body(
            terminal_id=self.terminal_id,
            kind=kind,
            amount=args["amount"],
            currency=args["currency"],
            card=card_from(args["card"]),
            installments=args.get("installments"),
            metadata=args.get("metadata"),
            captured_at=args.get("captured_at") or server_now,
            expires_at=expires,
            allow_duplicate=allow_duplicate,
        )
        # A UUIDv7 states when it was minted on the server's clock, and the server judges that
        # time (clock_skew, advice_too_old) — a time no re-stamp can ever change. With no
        # server time known yet (booted offline: the server never answered, no offset kept)
        # the SDK makes no such claim: a random UUIDv4, judged by captured_at alone, which
        # a stored sale may have re-stamped once the offset is known (contract §4.11).
        if self._current_offset() is None and not self._clock_asked:
            key = str(uuid.uuid4())
        else:
            key = str(uuid7(unix_ms=int(server_started * 1000)))
        steps = pay(
            self._ctx,
            key=key,
            request_json=body,
            deadline_s=float(deadline_s),
            reverse_late_approval=args.get("reverse_late_approval", False),
            owner=new_owner(),
        )
        return key, steps

    def _recovery(self) -> Steps[list[Recovered]]:
        return recover(self._ctx, owner=new_owner())

    def _reconciling(self, since: datetime, page_size: int) -> Steps[list[Transaction]]:
        return transactions(
            self._ctx,
            terminal_id=self.terminal_id,
            since=since,
            page_size=page_size,
            max_retries=self.retry.max_retries,
        )

    def _forwarding(self) -> Steps[list[Recovered]]:
        return forward_stored(self._ctx, owner=new_owner())

    def _handler(self, effect: Notify) -> Callable[[Any], object] | None:
        if effect.kind == "offline_decline":
            return self.on_offline_decline
        return self.on_offline_error

    def _journal_effect(self, effect: JournalEffect) -> object:
        journal = self.journal
        if isinstance(effect, Begin):
            return journal.begin(
                effect.key,
                effect.request_json,
                deadline=effect.deadline,
                reverse_late_approval=effect.reverse_late_approval,
                owner=effect.owner,
                lease_until=effect.lease_until,
            )
        if isinstance(effect, Claim):
            return journal.claim(effect.key, effect.owner, now=effect.now, hold_s=effect.hold_s)
        if isinstance(effect, Release):
            journal.release(effect.key, effect.owner)
            return None
        if isinstance(effect, Record):
            return journal.transition(
                effect.key,
                effect.state,
                attempts=effect.attempts,
                outcome=effect.outcome,
                request_json=effect.request_json,
            )
        if isinstance(effect, Store):
            return journal.store(
                effect.key,
                effect.advice_json,
                policy=effect.policy,
                now=effect.now,
                stamp=effect.stamp,
            )
        if isinstance(effect, Peek):
            return journal.get(effect.key)
        entries = journal.stored() if effect.stored_only else journal.unresolved()
        return [entry.key for entry in entries]

    def _close_journal(self) -> None:
        if self._owns_journal:
            self.journal.close()
