"""The protocol's building blocks: its ``Context``, one ``Run`` of one journal entry, and
the two effects every phase uses (``send``, ``sleep``)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from ._actions import Expected
from ._effects import HttpReply, NoReply, Record, Reply, Send, Sleep, Steps
from ._exceptions import APIError, InvalidTransitionError, JournalError, PaymentInDoubtError
from ._journal import JournalEntry
from ._models import JournalState
from ._offline import OfflinePolicy
from ._retry import RetryPolicy

__all__ = ["MIN_SEND_S", "Context", "Run", "SettledElsewhere", "send", "sleep"]

MIN_SEND_S = 0.01
"""Below this much time left, a request is not worth sending."""
FIRST_ABORT_S = 2.0
"""The first abort (always sent) gets at least this long, whatever the grace left."""


@dataclass(frozen=True, slots=True)
class Context:
    """Everything the protocol needs from the client that runs it.

    ``clock`` is the device's wall clock (journal deadlines, which must survive a reboot,
    and leases); ``monotonic`` times deadlines within a process (an NTP step moves
    neither); ``server_clock`` is the device clock corrected by the learned offset.
    ``offline``: the merchant's store-and-forward limits, None when offline selling is off."""

    headers: Mapping[str, str]
    timeout: float
    policy: RetryPolicy
    abort_grace_s: float
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    server_clock: Callable[[], float]
    rng: random.Random
    min_send_s: float = MIN_SEND_S
    offline: OfflinePolicy | None = None
    clock_known: Callable[[], bool] = lambda: True
    """Whether ``server_clock`` is corrected by an offset learned from the server (in this
    process, or kept in the journal from an earlier one): False, it is the raw device clock."""
    epoch: str = ""
    """Names this process's monotonic clock: a monotonic time recorded under another epoch
    (an earlier boot) means nothing now."""

    def now(self) -> datetime:
        """The server's time as best known (Retry-After dates are on its clock)."""
        return datetime.fromtimestamp(self.server_clock(), UTC)

    @property
    def hold_s(self) -> float:
        """How long past its deadline a driver may still be working on a key."""
        return 2 * self.abort_grace_s + 3 * self.timeout + self.policy.max_retry_after + 30.0


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


class SettledElsewhere(Exception):  # noqa: N818 - control flow inside the protocol only
    """Another driver already wrote this key's final state."""

    def __init__(self, entry: JournalEntry) -> None:
        super().__init__(entry.key)
        self.entry = entry


def _expected(entry: JournalEntry) -> Expected:
    try:
        request: Any = json.loads(entry.request_json)
    except ValueError:
        request = {}
    request = request if isinstance(request, dict) else {}
    return Expected(
        entry.key, request.get("type", "purchase"), request.get("amount"), request.get("currency")
    )


class Run:
    """Mutable state of one drive of one journal entry; ``deadline`` is monotonic."""

    def __init__(
        self,
        ctx: Context,
        entry: JournalEntry,
        *,
        deadline: float,
        on_not_found: Literal["resend", "wait", "fence"],
    ) -> None:
        self.ctx = ctx
        self.entry = entry
        self.key = entry.key
        self.state = entry.state
        self.attempts = entry.attempts
        self.deadline = deadline
        self.on_not_found = on_not_found
        self.expect = _expected(entry)
        self.step = 0
        self.maybe_sent = entry.state is not JournalState.PENDING
        self.rejection: APIError | None = None
        self.may_store = False  # a sale with its customer waiting, under an offline policy
        self.link_down = 0  # attempts in a row that could not connect at all

    def remaining(self) -> float:
        return self.deadline - self.ctx.monotonic()

    def record(
        self,
        state: JournalState,
        *,
        attempts: int | None = None,
        outcome: Mapping[str, Any] | None = None,
        result: object = None,
        request_json: str | None = None,
    ) -> Steps[None]:
        """Journal a transition. Already final → ``SettledElsewhere``; a storage failure
        → ``PaymentInDoubtError`` (with ``result``) once anything may have been sent."""
        try:
            yield Record(self.key, state, attempts, outcome, request_json)
        except InvalidTransitionError as exc:
            if isinstance(exc.entry, JournalEntry) and exc.entry.state.is_terminal:
                raise SettledElsewhere(exc.entry) from exc
            raise self._journal_failed(exc, state, result) from exc
        except Exception as exc:
            raise self._journal_failed(exc, state, result) from exc
        self.state = state

    def _journal_failed(self, exc: Exception, state: JournalState, result: object) -> Exception:
        if not self.maybe_sent:
            return JournalError(f"payment {self.key}: nothing was sent; journal failed: {exc}")
        return PaymentInDoubtError(
            f"payment {self.key}: the journal failed writing {state} ({exc}); "
            + ("the server's answer is attached; " if result is not None else "")
            + "the entry stays for recover()",
            key=self.key,
            result=result,
        )

    def wait(self, retry_after: float | None, until: float) -> Steps[None]:
        self.step += 1
        seconds = self.ctx.policy.wait(self.step, retry_after, self.ctx.rng)
        yield from sleep(min(seconds, until - self.ctx.monotonic()))

    def path(self, suffix: str = "") -> str:
        return f"/v1/transactions/{self.key}{suffix}"
