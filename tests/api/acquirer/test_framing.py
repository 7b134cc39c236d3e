"""The 2-byte big-endian length prefix: what is a frame, and what is garbage."""

from __future__ import annotations

import asyncio

import pytest

from api.acquirer.framing import FramingError, frame, read_frame


def stream(data: bytes, *, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def test_frames_follow_one_another_then_a_clean_end() -> None:
    reader = stream(frame(b"0800abc") + frame(b"x" * 300))
    assert await read_frame(reader) == b"0800abc"
    assert await read_frame(reader) == b"x" * 300
    assert await read_frame(reader) is None


def test_prefix_is_two_bytes_big_endian() -> None:
    assert frame(b"x" * 258)[:2] == b"\x01\x02"


async def test_a_frame_of_exactly_the_limit_is_read() -> None:
    assert await read_frame(stream(frame(b"y" * 64, max_size=64)), max_size=64) == b"y" * 64


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00\x00", "zero-length"),
        (b"\x00\x41" + b"z" * 65, "exceeds the limit of 64"),
        (b"\xff\xff", "exceeds the limit"),
        (b"\x00", "inside a length prefix"),
        (b"\x00\x10short", "after 5 of 16 bytes"),
    ],
    ids=["zero length", "one over the limit", "65535", "half a prefix", "truncated body"],
)
async def test_bad_frames_are_framing_errors(data: bytes, message: str) -> None:
    with pytest.raises(FramingError, match=message):
        await read_frame(stream(data), max_size=64)


async def test_an_oversized_frame_is_refused_before_its_body_arrives() -> None:
    with pytest.raises(FramingError, match="exceeds"):
        await read_frame(stream(b"\x10\x01", eof=False), max_size=4096)


@pytest.mark.parametrize("size", [0, 65])
def test_frame_refuses_empty_or_oversized_payloads(size: int) -> None:
    with pytest.raises(FramingError):
        frame(b"q" * size, max_size=64)
