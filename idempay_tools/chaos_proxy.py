"""A chaos TCP proxy for HTTP/1.1: a GPRS-like lossy link between terminals and the API.

    python -m idempay_tools.chaos_proxy --listen 127.0.0.1:8001 --target 127.0.0.1:8000 \
        --loss 0.035 --seed 1

Faults are decided **per request**, not per connection: clients keep connections alive,
so the proxy parses HTTP/1.1 framing (request line, headers, ``Content-Length`` or chunked
body) and draws one decision per request from a ``random.Random`` seeded with
``(seed, connection index)``. With probability ``loss`` a request hits a fault, whose mode
is drawn from the mix: ``delay_ratio``, ``reset_ratio``, ``hold_ratio``, and the rest split
``drop_request_ratio`` : ``1 - drop_request_ratio`` between

- ``drop_request``: close the client connection; the request is never forwarded;
- ``drop_response``: forward the request, read the server's whole answer (it processed
  it), then close the client connection before the answer reaches it (the in-doubt case);
- ``delay``: wait ``delay_s``, then pass;
- ``reset``: send a TCP RST (``SO_LINGER`` 0) to the client, before or after forwarding;
- ``hold``: keep the request ``hold_s`` seconds before forwarding it (the client usually
  times out meanwhile); it is then forwarded anyway, like an original released late by the
  network, and the answer recorded in ``released``. ``hold_next()`` / ``inject()`` force a
  mode for the next requests matching a request-line substring, for deterministic tests.

Each forwarded request uses its own upstream connection (so the server's keep-alive idle
timeout can never race a forwarded request); the client side keeps its connection alive.
Requests the proxy cannot frame (``Upgrade``, ``Expect``, bad ``Content-Length``) switch the
connection to a plain tunnel without faults. Only loopback addresses are accepted.
``stats`` counts requests by fate; ``on_request`` is told each request's fate with its
headers (the fleet simulator's link-loss ground truth: ``idempay_tools.simulate_links``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import itertools
import logging
import random
import signal
import socket
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType

__all__ = ["ChaosProxy", "ProxyThread", "Release", "main"]

log = logging.getLogger("idempay_tools.chaos_proxy")

MODES = ("drop_request", "drop_response", "delay", "reset", "hold")
STOP_S = 5.0  # how long stop() waits for the connections to end after cancelling them
_STAT_KEYS = (
    "connections",
    "requests",
    "passed",
    "drop_request",
    "drop_response",
    "delay",
    "reset_before",
    "reset_after",
    "hold",
    "upstream_errors",
    "tunnels",
)
_INJECTABLE = frozenset({*MODES, "reset_before", "reset_after", "pass"})


# ``on_request(request_line, headers, fate)``: called once per framed request when its fate
# is known — ``drop_request`` / ``reset_before`` (never forwarded), ``upstream_errors`` (the
# forward failed), or, once the server answered, the mode it met (``passed``, ``delay``,
# ``hold``, ``drop_response``, ``reset_after``). Headers are lower-cased. It runs on the
# proxy's event loop: keep it short and thread-safe.
Observer = Callable[[str, Mapping[str, str], str], None]


class _Unframeable(ValueError):
    """The request cannot be framed; tunnel the rest of the connection."""


@dataclass(frozen=True, slots=True)
class Release:
    """A held request that was finally forwarded, and the status the server answered."""

    request_line: str
    status: int | None


@dataclass
class _Injection:
    mode: str
    count: int
    match: str | None
    hold_s: float | None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _headers(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise _Unframeable(f"bad header line {line!r}")
            name = name.strip().lower()
            value = value.strip()
            if name in headers and name == "content-length" and headers[name] != value:
                raise _Unframeable("conflicting Content-Length")
            headers[name] = value
    return lines[0], headers


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ConnectionError("connection closed mid-head") from exc
        return None


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        line = await reader.readuntil(b"\r\n")
        parts.append(line)
        size = int(line.split(b";")[0].strip(), 16)
        if size == 0:
            while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                parts.append(trailer)
            parts.append(trailer)
            return b"".join(parts)
        parts.append(await reader.readexactly(size + 2))


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return await _read_chunked(reader)
    length = headers.get("content-length")
    if length is None:
        return b""
    if not length.isdigit():
        raise _Unframeable(f"bad Content-Length {length!r}")
    return await reader.readexactly(int(length))


async def _read_response(reader: asyncio.StreamReader, method: str) -> tuple[bytes, int, bool]:
    """One whole response: (bytes, status, keep_alive)."""
    data = b""
    while True:
        head = await _read_head(reader)
        if head is None:
            raise ConnectionError("upstream closed without a response")
        status_line, headers = _headers(head)
        try:
            status = int(status_line.split(" ")[1])
        except (IndexError, ValueError) as exc:
            raise _Unframeable(f"bad status line {status_line!r}") from exc
        data += head
        if status >= 200:
            break
    keep_alive = "close" not in headers.get("connection", "").lower()
    if method == "HEAD" or status in (204, 304):
        return data, status, keep_alive
    if "transfer-encoding" in headers or "content-length" in headers:
        return data + await _read_body(reader, headers), status, keep_alive
    return data + await reader.read(), status, False


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


class ChaosProxy:
    """An asyncio HTTP/1.1 proxy that injects seeded, per-request network faults."""

    def __init__(
        self,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        *,
        target_host: str,
        target_port: int,
        seed: int = 0,
        loss: float = 0.035,
        drop_request_ratio: float = 0.5,
        delay_ratio: float = 0.0,
        reset_ratio: float = 0.0,
        hold_ratio: float = 0.0,
        delay_s: float = 1.0,
        hold_s: float | None = None,
        on_request: Observer | None = None,
    ) -> None:
        for host in (listen_host, target_host):
            if not is_loopback(host):
                raise ValueError(f"refusing non-loopback address {host!r}")
        ratios = (loss, drop_request_ratio, delay_ratio, reset_ratio, hold_ratio)
        if not all(0.0 <= r <= 1.0 for r in ratios) or delay_ratio + reset_ratio + hold_ratio > 1:
            raise ValueError("probabilities must be in [0, 1]; delay+reset+hold ratios <= 1")
        if hold_ratio and hold_s is None:
            raise ValueError("hold_ratio needs hold_s")
        self.listen_host, self.listen_port = listen_host, listen_port
        self.target_host, self.target_port = target_host, target_port
        self.seed, self.loss, self.delay_s, self.hold_s = seed, loss, delay_s, hold_s
        rest = 1.0 - delay_ratio - reset_ratio - hold_ratio
        self._mix = (
            ("delay", delay_ratio),
            ("reset", reset_ratio),
            ("hold", hold_ratio),
            ("drop_request", rest * drop_request_ratio),
            ("drop_response", rest * (1.0 - drop_request_ratio)),
        )
        self._stats = dict.fromkeys(_STAT_KEYS, 0)
        self._on_request = on_request
        self.released: list[Release] = []
        self._injections: list[_Injection] = []
        self._lock = threading.Lock()
        self._indices = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.port = listen_port

    @property
    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    def inject(
        self, mode: str, *, count: int = 1, match: str | None = None, hold_s: float | None = None
    ) -> None:
        """Force ``mode`` on the next ``count`` requests whose request line contains
        ``match`` (any request when None). Thread-safe."""
        if mode not in _INJECTABLE:
            raise ValueError(f"unknown mode {mode!r}")
        if mode == "hold" and (hold_s or self.hold_s) is None:
            raise ValueError("hold needs hold_s")
        with self._lock:
            self._injections.append(_Injection(mode, count, match, hold_s or self.hold_s))

    def hold_next(
        self, count: int = 1, *, seconds: float | None = None, match: str | None = None
    ) -> None:
        """Hold the next matching request(s) ``seconds`` (default ``hold_s``) before
        forwarding them."""
        self.inject("hold", count=count, match=match, hold_s=seconds)

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._on_connection, self.listen_host, self.listen_port
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info(
            "chaos proxy %s:%d -> %s:%d",
            self.listen_host,
            self.port,
            self.target_host,
            self.target_port,
        )

    async def stop(self) -> None:
        """Close the listener and every connection; bounded (``STOP_S``): a connection task
        that does not end when cancelled (a peer that never closes) never holds the stop."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=STOP_S)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), STOP_S)

    async def __aenter__(self) -> ChaosProxy:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def run_in_thread(self) -> ProxyThread:
        """Run the proxy on its own event loop in a daemon thread (for sync code)."""
        return ProxyThread(self)

    def _count(self, key: str) -> None:
        with self._lock:
            self._stats[key] += 1

    def _decide(self, rng: random.Random, request_line: str) -> tuple[str, float | None]:
        """Three draws per request, whatever is injected, so a seed replays exactly."""
        roll, pick, before = rng.random(), rng.random(), rng.random() < 0.5
        injected = self._injected(request_line)
        if injected is not None:
            mode, hold_s = injected
        else:
            mode, hold_s = self._draw(roll, pick), self.hold_s
        if mode == "reset":
            mode = "reset_before" if before else "reset_after"
        return mode, hold_s

    def _draw(self, roll: float, pick: float) -> str:
        if roll >= self.loss:
            return "pass"
        for name, weight in self._mix:
            pick -= weight
            if pick < 0:
                return name
        return "drop_response"

    def _injected(self, request_line: str) -> tuple[str, float | None] | None:
        with self._lock:
            for injection in self._injections:
                if injection.match is None or injection.match in request_line:
                    injection.count -= 1
                    if injection.count <= 0:
                        self._injections.remove(injection)
                    return injection.mode, injection.hold_s
        return None

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        index = next(self._indices)
        self._count("connections")
        rng = random.Random(f"{self.seed}:{index}")
        try:
            while await self._one_request(rng, reader, writer):
                pass
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _one_request(
        self, rng: random.Random, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Serve one request; False when the client connection must end."""
        head = await _read_head(reader)
        if head is None:
            return False
        try:
            request_line, headers = _headers(head)
            if "upgrade" in headers or "expect" in headers:
                raise _Unframeable("upgrade/expect")
            request = head + await _read_body(reader, headers)
        except _Unframeable:
            await self._tunnel(head, reader, writer)
            return False
        self._count("requests")
        mode, hold_s = self._decide(rng, request_line)
        self._count("passed" if mode == "pass" else mode)
        if mode in ("drop_request", "reset_before"):
            self._observe(request_line, headers, mode)
            if mode == "reset_before":
                _reset(writer)
            return False
        if mode == "delay":
            await asyncio.sleep(self.delay_s)
        if mode == "hold":
            await asyncio.sleep(hold_s or 0.0)
        method = request_line.split(" ")[0]
        try:
            response, status, keep_alive = await self._forward(request, method)
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            self._count("upstream_errors")
            self._observe(request_line, headers, "upstream_errors")
            if mode == "hold":
                self._record_release(request_line, None)
            return False
        self._observe(request_line, headers, "passed" if mode == "pass" else mode)
        if mode == "hold":
            self._record_release(request_line, status)
        if mode in ("drop_response", "reset_after"):
            if mode == "reset_after":
                _reset(writer)
            return False
        writer.write(response)
        await writer.drain()
        return keep_alive and "close" not in headers.get("connection", "").lower()

    def _observe(self, request_line: str, headers: dict[str, str], fate: str) -> None:
        if self._on_request is not None:
            self._on_request(request_line, headers, fate)

    def _record_release(self, request_line: str, status: int | None) -> None:
        with self._lock:
            self.released.append(Release(request_line, status))

    async def _forward(self, request: bytes, method: str) -> tuple[bytes, int, bool]:
        up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        try:
            up_writer.write(request)
            await up_writer.drain()
            return await _read_response(up_reader, method)
        finally:
            up_writer.close()

    async def _tunnel(
        self, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._count("tunnels")
        up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        try:
            up_writer.write(first)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()


class ProxyThread:
    """A ``ChaosProxy`` running in a background thread, for sync code: ``.port``,
    ``.stats``, ``.released``, ``.inject()`` / ``.hold_next()`` (thread-safe), ``.stop()``."""

    def __init__(self, proxy: ChaosProxy) -> None:
        self.proxy = proxy
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="chaos-proxy", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def stats(self) -> dict[str, int]:
        return self.proxy.stats

    @property
    def released(self) -> list[Release]:
        return list(self.proxy.released)

    def inject(
        self, mode: str, *, count: int = 1, match: str | None = None, hold_s: float | None = None
    ) -> None:
        self.proxy.inject(mode, count=count, match=match, hold_s=hold_s)

    def hold_next(
        self, count: int = 1, *, seconds: float | None = None, match: str | None = None
    ) -> None:
        self.proxy.hold_next(count, seconds=seconds, match=match)

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.proxy.stop(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.proxy.start())
        except BaseException as exc:  # handed to the caller of run_in_thread()
            self._error = exc
            self._ready.set()
            self._loop.close()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    if not is_loopback(host):
        raise argparse.ArgumentTypeError(f"refusing non-loopback address {host!r}")
    return host, int(port)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m idempay_tools.chaos_proxy",
        description="Lossy-link HTTP/1.1 proxy (loopback only).",
    )
    parser.add_argument("--listen", type=_address, default=("127.0.0.1", 8001))
    parser.add_argument("--target", type=_address, default=("127.0.0.1", 8000))
    parser.add_argument("--loss", type=float, default=0.035)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--drop-request-ratio", type=float, default=0.5)
    parser.add_argument("--delay-ratio", type=float, default=0.0)
    parser.add_argument("--reset-ratio", type=float, default=0.0)
    parser.add_argument("--hold-ratio", type=float, default=0.0)
    parser.add_argument("--delay-s", type=float, default=1.0)
    parser.add_argument("--hold-s", type=float, default=None)
    return parser


def build(argv: list[str] | None = None) -> ChaosProxy:
    args = _parser().parse_args(argv)
    return ChaosProxy(
        args.listen[0],
        args.listen[1],
        target_host=args.target[0],
        target_port=args.target[1],
        seed=args.seed,
        loss=args.loss,
        drop_request_ratio=args.drop_request_ratio,
        delay_ratio=args.delay_ratio,
        reset_ratio=args.reset_ratio,
        hold_ratio=args.hold_ratio,
        delay_s=args.delay_s,
        hold_s=args.hold_s,
    )


async def _serve(proxy: ChaosProxy) -> None:
    """Serve until SIGINT or SIGTERM. The handlers are installed here, not left to
    asyncio.run: a process started in the background of a non-interactive shell inherits
    SIGINT ignored, and asyncio.run then never sees the interrupt."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with proxy:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    proxy = build(argv)
    try:
        asyncio.run(_serve(proxy))
    except KeyboardInterrupt:
        pass
    finally:
        log.info("stats %s", proxy.stats)


if __name__ == "__main__":
    main()
