"""``Client`` and ``AsyncClient``: the same surface, differing only in how they run the
protocol's effects (blocking calls vs awaits; journal writes go to a thread when async).

An effect that fails is thrown into the protocol, which decides what it means; ``_send``
never raises: whatever goes wrong once a request may have left is a ``NoReply``."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from types import TracebackType
from typing import TypeVar, Unpack

import httpx

from ._base_client import (
    BaseClient,
    PaymentArgs,
    PaymentKind,
    PurchaseArgs,
    check_payment,
    no_reply,
    reply_from,
    send_kwargs,
)
from ._calls import abort, lookup, reverse
from ._effects import Done, Notify, Reply, Send, Sleep, Steps, advance
from ._models import Fenced, Processing, Recovered, Transaction

__all__ = ["AsyncClient", "Client"]

_T = TypeVar("_T")
CLOCK_SYNC_PATH = "/healthz"
CLOCK_SYNC_TIMEOUT_S = 2.0  # a slower answer says too little about the server's clock


class Client(BaseClient[httpx.BaseTransport, Callable[[float], None]]):
    """Blocking terminal client. One per process; thread-safe.

    ```python
    with Client(base_url, api_key, terminal_id="T-0001", journal="pos.db") as pos:
        pos.recover()
        result = pos.purchase(amount=1250, currency="BRL", card=card, deadline_s=60)
    ```

    Arguments (all but the first two keyword-only):

    - ``base_url``, ``api_key``: the server, and the merchant's API key (a bearer token).
    - ``terminal_id``: sent with every payment.
    - ``journal``: the durable journal — a SQLite path (the client opens and closes it)
      or a ``Journal`` the caller owns and may share between clients.
    - ``network``: the link, sent as ``POS-Network`` (``gprs``, ``3g``, ``4g``, ``wifi``,
      ``ethernet``, ``other``).
    - ``timeout``: seconds per HTTP request.
    - ``transport``: an httpx transport (tests: ``httpx.MockTransport``,
      ``client_sdk.faults.FaultTransport``).
    - ``retry``: a ``RetryPolicy`` (backoff, its cap, the ``Retry-After`` clamp, the retries
      of a single lookup/abort/reverse); the default is ``RetryPolicy()``.
    - ``abort_grace_s``: how long past the deadline the SDK keeps trying to land the abort.
    - ``send_expires_at``: send ``expires_at`` (the deadline) so a copy the network holds
      past it is refused by the server.
    - ``seed``, ``clock``, ``monotonic``, ``sleep``: jitter seed and time sources, for tests.
    - ``offline``: an ``OfflinePolicy`` to sell while the server cannot be reached at all
      (store and forward; off by default). ``on_offline_decline(transaction)``: the issuer
      declined a forwarded offline payment; ``on_offline_error(error)``: a stored payment
      to reconcile (``AdviceTooOldError``, ``StoredPaymentOverdueError``, a body the server
      refused: ``ValidationFailedError``, a fenced key).
    - ``base_backoff``, ``max_backoff``, ``max_retries``: **deprecated** (one release) —
      ``RetryPolicy(base=, cap=, max_retries=)``; they warn (``DeprecationWarning``), and
      passing any of them together with ``retry`` is a ``TypeError``.

    Raises ``ValueError`` for an out-of-range setting.
    """

    def _connect(
        self,
        base_url: str,
        *,
        transport: httpx.BaseTransport | None,
        timeout: float,
        sleep: Callable[[float], None] | None,
    ) -> None:
        self._http = httpx.Client(base_url=base_url, transport=transport, timeout=timeout)
        self._sleep = sleep or time.sleep

    def purchase(self, **payment: Unpack[PurchaseArgs]) -> Transaction:
        """Sell: charge ``amount`` (minor units of ``currency``, e.g. 1250 BRL = R$ 12.50)
        to ``card`` (a ``Card`` or a ``{"token", "last4", "brand"}`` mapping), exactly once.

        Keyword arguments (``PurchaseArgs``, shared with ``AsyncClient``): ``amount``,
        ``currency``, ``card`` (required); ``deadline_s=60``, ``installments=None``,
        ``metadata=None``, ``captured_at=None`` (now), ``reverse_late_approval=False``,
        ``allow_duplicate=False``. A missing or unknown one is a ``TypeError``.

        The key is minted and the request journaled before the first byte leaves; a lost
        answer is resolved by key (lookup, resend with the same key), and at
        ``deadline_s`` the key is aborted. With ``reverse_late_approval`` an approval
        that lands after the deadline is reversed (the customer has left).

        Under an ``offline`` policy, payments stored earlier are forwarded first (oldest
        first; never an error for this sale), and a payment that cannot reach the server
        at all is accepted offline: the result has ``offline=True``, the journal holds it
        STORED until it is forwarded.

        With ``allow_duplicate`` (the cashier confirmed a sale the merchant's duplicate
        guard refused) the create says ``"allow_duplicate": true`` and is processed even if
        suspected: a NEW payment, new key (contract §4.13).

        Returns the ``Transaction`` (``status`` ``"approved"`` or ``"declined"``). Raises
        ``PaymentAbortedError`` (definitive: never charged; ``OfflineLimitError`` when the
        server was unreachable and the offline policy refused it; ``SuspectedDuplicateError``
        when the duplicate guard refused it as a repeat of ``duplicate_of`` — the key is
        fenced), ``PaymentInDoubtError`` (no definitive answer could be recorded;
        ``recover()`` settles it later), an ``APIError`` subclass for a request the server
        refused (e.g. ``ValidationFailedError``), ``ValueError`` for a bad argument.
        """
        allow_duplicate = payment.pop("allow_duplicate", False)
        return self._sell("purchase", payment, allow_duplicate=allow_duplicate)

    def refund(self, **payment: Unpack[PaymentArgs]) -> Transaction:
        """Refund ``amount`` to ``card``: the same guarantees, arguments (``PaymentArgs``:
        all of ``purchase``'s but ``allow_duplicate``), result and errors as ``purchase``
        (a refund is never accepted offline, nor guarded)."""
        return self._sell("refund", payment)

    def lookup(self, id: str) -> Transaction | Processing:
        """The server's answer for key ``id``: the ``Transaction``, or ``Processing``
        while it is still being worked on. Raises ``NotFoundError`` (nothing under the
        key), ``TransactionAbortedError`` / ``RequestExpiredError`` (fenced),
        ``APIConnectionError`` after ``retry.max_retries`` retries without an answer."""
        return self._run(lookup(self._ctx, id, max_retries=self.retry.max_retries))

    def abort(self, id: str) -> Transaction | Fenced:
        """Fence key ``id`` so it is never processed: ``Fenced`` if it was not, else
        the ``Transaction`` it already produced (abort never undoes a processed payment;
        see ``reverse``). Raises an ``APIError`` subclass or ``APIConnectionError``."""
        return self._run(abort(self._ctx, id, max_retries=self.retry.max_retries))

    def reverse(self, id: str) -> Transaction:
        """Undo the approved transaction under key ``id``; returns it as ``reversed``.
        Raises ``NotReversibleError`` (declined or aborted), ``NotFoundError``, or
        ``APIConnectionError``."""
        return self._run(reverse(self._ctx, id, max_retries=self.retry.max_retries))

    def recover(self) -> list[Recovered]:
        """Settle every unfinished journal entry no other driver holds (never sells):
        forward the payments sold offline (oldest first, never aborted), then look each
        other key up, fence with abort what the server does not know, and report one
        ``Recovered`` per entry; one bad entry does not stop the others. Call on boot."""
        return self._run(self._recovery())

    def forward(self) -> list[Recovered]:
        """Forward the payments stored offline now, oldest first (each under its lease):
        one ``Recovered`` per stored entry — RESOLVED with the server's transaction,
        REPORTED (``AdviceTooOldError``, a fenced key), or still STORED with what kept it.
        A refusal about one entry (``ClockSkewError``, a 4xx about its body) does not hold
        back the ones behind it; the link down stops the pass (the rest are only
        age-checked: ``StoredPaymentOverdueError`` once past ``max_age_s``)."""
        return self._run(self._forwarding())

    def reconcile(self, *, since: datetime, page_size: int = 100) -> list[Transaction]:
        """This terminal's transactions on the server created since ``since`` (aware
        datetime), oldest first, every page of ``GET /v1/transactions`` — for a terminal
        that lost its journal. Raises an ``APIError`` or ``APIConnectionError``."""
        return self._run(self._reconciling(since, page_size))

    def close(self) -> None:
        """Close the HTTP connections, and the journal if the client opened it."""
        self._http.close()
        self._close_journal()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _sell(
        self, kind: PaymentKind, args: PaymentArgs, *, allow_duplicate: bool = False
    ) -> Transaction:
        check_payment(kind, args)
        self._learn_clock()
        self._forward_first()
        _, steps = self._payment(kind, args, allow_duplicate=allow_duplicate)
        return self._run(steps)

    def _run(self, steps: Steps[_T]) -> _T:
        try:
            return self._interpret(steps)
        except BaseException as exc:
            steps.close()  # interrupted: the protocol ends its drive (no effect runs)
            self._name_key(exc)
            raise

    def _interpret(self, steps: Steps[_T]) -> _T:
        reply: object = None
        failure: Exception | None = None
        while not isinstance(effect := advance(steps, reply, failure), Done):
            reply, failure = None, None
            try:
                if isinstance(effect, Send):
                    reply = self._send(effect)
                elif isinstance(effect, Sleep):
                    self._sleep(effect.seconds)
                elif isinstance(effect, Notify):
                    self._notify(effect)
                else:
                    reply = self._journal_effect(effect)
            except Exception as exc:
                failure = exc
        return effect.value

    def _notify(self, effect: Notify) -> None:
        handler = self._handler(effect)
        if handler is not None:
            handler(effect.payload)

    def _forward_first(self) -> None:
        """Under an offline policy, forward what is stored before the next sale; what it
        finds is told through the callbacks, never raised into the sale. Not while the link
        is known down: the pass would only find it down again, and the customer waits."""
        if self.offline is None or self.link_known_down():
            return
        try:
            self._run(self._forwarding())
        except Exception:  # noqa: BLE001 - settling older sales never fails this one
            return

    def _learn_clock(self) -> None:
        """Before this client's first payment, ask the server its time (``GET /healthz``,
        one quick round trip), so that even the first key's UUIDv7 time and
        ``captured_at`` are on the server's clock: a terminal booting with its clock far
        off would otherwise be refused (422 clock_skew, 410 request_expired). Best effort:
        when the server cannot be reached the payment goes ahead on the device clock."""
        if self._clock_asked or self.link_known_down():  # the sale's attempts will tell
            return
        sent_at = self._ctx.clock()
        try:
            response = self._http.get(CLOCK_SYNC_PATH, timeout=CLOCK_SYNC_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - nothing was sent that matters: no payment yet
            return  # (its short timeout proves nothing about a slow link: not "down")
        self._clock_asked = True
        self._observe_clock(response, sent_at)

    def _send(self, effect: Send) -> Reply:
        sent_at = self._ctx.clock()
        short = self.link_known_down()
        kwargs = {**send_kwargs(effect), "timeout": self._timeout_for(effect.timeout)}
        try:
            response = self._http.request(effect.method, effect.path, **kwargs)
        except Exception as exc:
            self._note_link(exc, short=short)
            return no_reply(exc)
        self._note_link(None, short=short)
        try:
            self._observe_clock(response, sent_at)
            return reply_from(response)
        except Exception as exc:
            return no_reply(exc)


class AsyncClient(BaseClient[httpx.AsyncBaseTransport, Callable[[float], Awaitable[None]]]):
    """Asyncio terminal client: the same arguments and surface as ``Client``, with
    coroutine methods (journal writes run in a worker thread).

    ```python
    async with AsyncClient(base_url, api_key, terminal_id="T-0001") as pos:
        result = await pos.purchase(amount=1250, currency="BRL", card=card)
    ```
    """

    def _connect(
        self,
        base_url: str,
        *,
        transport: httpx.AsyncBaseTransport | None,
        timeout: float,
        sleep: Callable[[float], Awaitable[None]] | None,
    ) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, transport=transport, timeout=timeout)
        self._sleep = sleep or asyncio.sleep

    async def purchase(self, **payment: Unpack[PurchaseArgs]) -> Transaction:
        """``Client.purchase``, awaited: the same guarantees, result and errors."""
        allow_duplicate = payment.pop("allow_duplicate", False)
        return await self._sell("purchase", payment, allow_duplicate=allow_duplicate)

    async def refund(self, **payment: Unpack[PaymentArgs]) -> Transaction:
        """``Client.refund``, awaited: the same guarantees, result and errors."""
        return await self._sell("refund", payment)

    async def lookup(self, id: str) -> Transaction | Processing:
        """``Client.lookup``, awaited."""
        return await self._run(lookup(self._ctx, id, max_retries=self.retry.max_retries))

    async def abort(self, id: str) -> Transaction | Fenced:
        """``Client.abort``, awaited."""
        return await self._run(abort(self._ctx, id, max_retries=self.retry.max_retries))

    async def reverse(self, id: str) -> Transaction:
        """``Client.reverse``, awaited."""
        return await self._run(reverse(self._ctx, id, max_retries=self.retry.max_retries))

    async def recover(self) -> list[Recovered]:
        """``Client.recover``, awaited: settles the journal, never sells."""
        return await self._run(self._recovery())

    async def forward(self) -> list[Recovered]:
        """``Client.forward``, awaited."""
        return await self._run(self._forwarding())

    async def reconcile(self, *, since: datetime, page_size: int = 100) -> list[Transaction]:
        """``Client.reconcile``, awaited."""
        return await self._run(self._reconciling(since, page_size))

    async def close(self) -> None:
        """Close the HTTP connections, and the journal if the client opened it."""
        try:
            await self._http.aclose()
        except RuntimeError:  # connections left on an event loop that is already closed
            pass
        finally:
            self._close_journal()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _sell(
        self, kind: PaymentKind, args: PaymentArgs, *, allow_duplicate: bool = False
    ) -> Transaction:
        check_payment(kind, args)
        await self._learn_clock()
        await self._forward_first()
        _, steps = self._payment(kind, args, allow_duplicate=allow_duplicate)
        return await self._run(steps)

    async def _run(self, steps: Steps[_T]) -> _T:
        try:
            return await self._interpret(steps)
        except BaseException as exc:
            steps.close()  # cancelled: the protocol ends its drive (no effect runs)
            self._name_key(exc)
            raise

    async def _interpret(self, steps: Steps[_T]) -> _T:
        reply: object = None
        failure: Exception | None = None
        while not isinstance(effect := advance(steps, reply, failure), Done):
            reply, failure = None, None
            try:
                if isinstance(effect, Send):
                    reply = await self._send(effect)
                elif isinstance(effect, Sleep):
                    await self._sleep(effect.seconds)
                elif isinstance(effect, Notify):
                    await self._notify(effect)
                else:
                    reply = await asyncio.to_thread(self._journal_effect, effect)
            except Exception as exc:
                failure = exc
        return effect.value

    async def _notify(self, effect: Notify) -> None:
        handler = self._handler(effect)
        if handler is not None:
            answer = handler(effect.payload)
            if inspect.isawaitable(answer):
                await answer

    async def _forward_first(self) -> None:
        """``Client._forward_first``, awaited."""
        if self.offline is None or self.link_known_down():
            return
        try:
            await self._run(self._forwarding())
        except Exception:  # noqa: BLE001 - settling older sales never fails this one
            return

    async def _learn_clock(self) -> None:
        """``Client._learn_clock``, awaited."""
        if self._clock_asked or self.link_known_down():  # the sale's attempts will tell
            return
        sent_at = self._ctx.clock()
        try:
            response = await self._http.get(CLOCK_SYNC_PATH, timeout=CLOCK_SYNC_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - nothing was sent that matters: no payment yet
            return  # (its short timeout proves nothing about a slow link: not "down")
        self._clock_asked = True
        self._observe_clock(response, sent_at)

    async def _send(self, effect: Send) -> Reply:
        sent_at = self._ctx.clock()
        short = self.link_known_down()
        kwargs = {**send_kwargs(effect), "timeout": self._timeout_for(effect.timeout)}
        try:
            response = await self._http.request(effect.method, effect.path, **kwargs)
        except Exception as exc:
            self._note_link(exc, short=short)
            return no_reply(exc)
        self._note_link(None, short=short)
        try:
            self._observe_clock(response, sent_at)
            return reply_from(response)
        except Exception as exc:
            return no_reply(exc)
