"""One persistent connection of the link: requests are written by their callers, and one
reader task resolves their futures by (STAN, RRN).

What the reader does with each frame:

- an answer whose (STAN, RRN) is pending with the expected MTI → that request's answer;
- an answer whose (STAN, RRN) recently gave up waiting (timed out, or its connection
  broke) → a **late answer**: logged, counted, dropped; the connection stays;
- anything else — a frame that does not decode, an answer nobody asked for, the wrong
  MTI for its STAN, a bad length → **garbage**: logged, counted, and the connection is
  reset: every request pending on it (all of them were written) becomes :class:`InDoubt`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

import structlog

from api.acquirer.framing import FramingError, frame, read_frame
from api.acquirer.messages import Answer, MessageError, parse_answer
from api.acquirer.types import InDoubt

log = structlog.get_logger("idempay.acquirer")

Key = tuple[str, str]  # (STAN, RRN); RRN "" for network messages


class NotWritten(Exception):
    """The connection was known dead before the write: nothing of the message left."""


@dataclass(slots=True)
class Shared:
    """What every connection of a link shares: the recently expired keys and counters."""

    expired_capacity: int = 10_000
    expired: OrderedDict[Key, None] = field(default_factory=OrderedDict)
    late_answers: int = 0
    garbage_frames: int = 0

    def expire(self, key: Key) -> None:
        self.expired[key] = None
        self.expired.move_to_end(key)
        while len(self.expired) > self.expired_capacity:
            self.expired.popitem(last=False)


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[Answer]
    expect: str  # the answer MTI this request takes


class Connection:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        shared: Shared,
        name: str,
        max_frame: int,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._shared = shared
        self._max_frame = max_frame
        self.name = name
        self.pending: dict[Key, _Pending] = {}
        self.closed = asyncio.Event()
        self.last_read = asyncio.get_running_loop().time()
        self.mid_frame = False  # a length prefix read, its frame not yet complete
        self._task = asyncio.create_task(self._read_loop(), name=f"acquirer-reader-{name}")

    @property
    def alive(self) -> bool:
        return not self.closed.is_set() and not self._writer.is_closing()

    def send(self, payload: bytes, *, key: Key, expect: str) -> asyncio.Future[Answer]:
        """Write one framed message. Synchronous: once it returns, bytes may have left, so
        the caller's outcome is the future's or in doubt. Raises :class:`NotWritten` when
        the connection was already dead."""
        data = frame(payload, max_size=self._max_frame)
        if not self.alive:
            raise NotWritten(self.name)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.pending[key] = _Pending(future, expect)
        self._writer.write(data)
        return future

    async def drain(self) -> None:
        await self._writer.drain()

    def forget(self, key: Key) -> None:
        """The caller stopped waiting without an answer: later answers to ``key`` are late."""
        if self.pending.pop(key, None) is not None:
            self._shared.expire(key)

    def reset(self, reason: str) -> None:
        """Close now; every pending request becomes :class:`InDoubt`."""
        if self.closed.is_set():
            return
        self.closed.set()
        self._writer.transport.abort()
        for key, pending in self.pending.items():
            self._shared.expire(key)
            if not pending.future.done():
                pending.future.set_exception(InDoubt(f"connection reset: {reason}"))
        self.pending.clear()
        if self._task is not asyncio.current_task():
            self._task.cancel()
        log.warning("acquirer.connection_reset", connection=self.name, reason=reason)

    async def aclose(self, reason: str) -> None:
        self.reset(reason)
        if self._task is not asyncio.current_task():
            await asyncio.wait({self._task})

    def _garbage(self, reason: str) -> None:
        self._shared.garbage_frames += 1
        log.error("acquirer.garbage", connection=self.name, reason=reason)
        self.reset(f"garbage: {reason}")

    def _entered_frame(self) -> None:
        self.mid_frame = True

    async def _read_loop(self) -> None:
        try:
            while True:
                payload = await read_frame(
                    self._reader, max_size=self._max_frame, on_prefix=self._entered_frame
                )
                self.mid_frame = False
                if payload is None:
                    self.reset("closed by the acquirer")
                    return
                self.last_read = asyncio.get_running_loop().time()
                self._dispatch(payload)
        except FramingError as exc:
            self._garbage(str(exc))
        except OSError as exc:
            self.reset(f"read failed: {exc!r}")

    def _dispatch(self, payload: bytes) -> None:
        try:
            answer = parse_answer(payload)
        except MessageError as exc:
            self._garbage(str(exc))
            return
        key = (answer.stan, answer.rrn)
        pending = self.pending.get(key)
        if pending is None:
            if key in self._shared.expired:
                self._shared.late_answers += 1
                log.warning(
                    "acquirer.late_answer", connection=self.name, mti=answer.mti,
                    stan=answer.stan, rrn=answer.rrn, response_code=answer.response_code,
                )  # fmt: skip
                return
            self._garbage(f"{answer.mti} for unknown STAN {answer.stan} RRN {answer.rrn!r}")
            return
        if answer.mti != pending.expect:
            self._garbage(f"{answer.mti} for STAN {answer.stan}, expected {pending.expect}")
            return
        del self.pending[key]
        if not pending.future.done():
            pending.future.set_result(answer)
