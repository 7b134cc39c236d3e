"""Framing: each ISO 8583 message on the wire is preceded by its length, 2 bytes big-endian.

A frame of length 0, longer than ``max_size``, or cut short by the end of the stream is a
:class:`FramingError`; the connection it came on can no longer be trusted to be in step
and is closed by whoever reads it. A clean end of stream between frames is not an error:
:func:`read_frame` returns ``None``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["MAX_FRAME", "FramingError", "frame", "read_frame", "write_frame"]

MAX_FRAME = 4096
"""The largest message either side accepts (the longest we build is under 1,200 bytes)."""


class FramingError(Exception):
    """A length prefix of 0 or over the limit, or a frame cut short by the end of stream."""


def frame(payload: bytes | bytearray, *, max_size: int = MAX_FRAME) -> bytes:
    """``payload`` behind its 2-byte big-endian length."""
    size = len(payload)
    if not 0 < size <= min(max_size, 0xFFFF):
        raise FramingError(f"cannot frame {size} bytes (1..{min(max_size, 0xFFFF)})")
    return size.to_bytes(2, "big") + payload


# Once a frame's length prefix has arrived, the rest must follow within this: a peer that
# stops mid-frame would otherwise hold the reader forever and swallow the next answers.
BODY_WITHIN_S = 5.0


async def read_frame(
    reader: asyncio.StreamReader,
    *,
    max_size: int = MAX_FRAME,
    body_within_s: float = BODY_WITHIN_S,
    on_prefix: Callable[[], None] | None = None,
) -> bytes | None:
    """The next message's bytes, or ``None`` at a clean end of stream between frames. A
    frame whose body does not arrive within ``body_within_s`` of its prefix is a
    :class:`FramingError` (a truncated frame, not a slow one: frames are small)."""
    try:
        prefix = await reader.readexactly(2)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FramingError("stream ended inside a length prefix") from None
    if on_prefix is not None:  # the reader is inside a frame from here to its end
        on_prefix()
    size = int.from_bytes(prefix, "big")
    if size == 0:
        raise FramingError("zero-length frame")
    if size > max_size:
        raise FramingError(f"frame of {size} bytes exceeds the limit of {max_size}")
    try:
        async with asyncio.timeout(body_within_s):
            return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise FramingError(f"stream ended after {len(exc.partial)} of {size} bytes") from None
    except TimeoutError:
        why = f"frame of {size} bytes not complete within {body_within_s:g} s"
        raise FramingError(why) from None


async def write_frame(
    writer: asyncio.StreamWriter, payload: bytes | bytearray, *, max_size: int = MAX_FRAME
) -> None:
    """Write one framed message (one ``write`` call) and wait for the buffer to drain."""
    writer.write(frame(payload, max_size=max_size))
    await writer.drain()
