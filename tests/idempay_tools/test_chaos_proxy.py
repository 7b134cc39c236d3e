"""The chaos proxy (idempay_tools/chaos_proxy.py) against a tiny HTTP echo server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx
import pytest

from idempay_tools.chaos_proxy import ChaosProxy, build
from tests.support.eventually import eventually_async

LOCAL = "127.0.0.1"


class EchoServer:
    """HTTP/1.1 echo server: answers each request with JSON of what it received."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, LOCAL, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                method, path, _ = head.split("\r\n")[0].split(" ")
                headers = dict(
                    (name.strip().lower(), value.strip())
                    for name, value in (
                        line.split(":", 1) for line in head.split("\r\n")[1:] if line
                    )
                )
                if headers.get("transfer-encoding") == "chunked":
                    body = await _dechunk(reader)
                else:
                    body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.seen.append((method, path, body))
                payload = json.dumps(
                    {"method": method, "path": path, "body": body.decode()}
                ).encode()
                writer.write(_response(payload, chunked=path == "/chunked"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _dechunk(reader: asyncio.StreamReader) -> bytes:
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
        body += (await reader.readexactly(size + 2))[:-2]
    await reader.readuntil(b"\r\n")
    return body


def _response(payload: bytes, *, chunked: bool) -> bytes:
    if not chunked:
        return (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(payload) + payload
        )
    half = len(payload) // 2
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (payload[:half], payload[half:]))
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    )


@pytest.fixture
async def echo_server() -> AsyncIterator[EchoServer]:
    server = EchoServer()
    await server.start()
    yield server
    await server.stop()


def proxy_for(server: EchoServer, **options: Any) -> ChaosProxy:
    return ChaosProxy(target_host=LOCAL, target_port=server.port, **options)


async def outcome(client: httpx.AsyncClient, path: str, body: str = "") -> str:
    try:
        response = await client.post(path, content=body)
    except httpx.TransportError as exc:
        return type(exc).__name__
    assert response.json()["body"] == body
    return "ok"


async def test_passthrough_keeps_the_connection_alive_and_frames_bodies(
    echo_server: EchoServer,
) -> None:
    async with (
        proxy_for(echo_server, loss=0.0) as proxy,
        httpx.AsyncClient(base_url=f"http://{LOCAL}:{proxy.port}") as client,
    ):
        for i in range(10):
            response = await client.post(f"/v1/transactions/{i}", json={"n": i})
            assert response.json() == {
                "method": "POST",
                "path": f"/v1/transactions/{i}",
                "body": json.dumps({"n": i}).replace(" ", ""),
            }
        assert (await client.get("/chunked")).json()["path"] == "/chunked"

        async def chunks() -> AsyncIterator[bytes]:
            yield b"part one, "
            yield b"part two"

        streamed = await client.post("/stream", content=chunks())
        assert streamed.json()["body"] == "part one, part two"
        stats = proxy.stats
    assert (stats["requests"], stats["passed"], stats["connections"]) == (12, 12, 1)
    assert len(echo_server.seen) == 12


async def test_with_a_seed_every_fault_mode_happens_and_is_counted(echo_server: EchoServer) -> None:
    async with proxy_for(
        echo_server,
        seed=3,
        loss=1.0,
        delay_ratio=0.2,
        reset_ratio=0.2,
        hold_ratio=0.1,
        hold_s=0.01,
        delay_s=0.01,
    ) as proxy:
        async with httpx.AsyncClient(base_url=f"http://{LOCAL}:{proxy.port}") as client:
            results = [await outcome(client, "/x", f"r{i}") for i in range(80)]
        stats = proxy.stats
    for mode in ("drop_request", "drop_response", "delay", "reset_before", "reset_after", "hold"):
        assert stats[mode] > 0, stats
    assert stats["passed"] == 0 and stats["requests"] == 80
    assert results.count("ok") == stats["delay"] + stats["hold"]
    forwarded = 80 - stats["drop_request"] - stats["reset_before"]
    assert len(echo_server.seen) == forwarded
    assert len(proxy.released) == stats["hold"]
    assert {r.status for r in proxy.released} == {200}


async def test_on_request_tells_each_request_its_fate_with_its_headers(
    echo_server: EchoServer,
) -> None:
    """What the fleet's link-loss ground truth is built on: one call per request, and the
    ones called lost before forwarding are exactly those the server never saw."""
    fates: list[tuple[str, str, str]] = []

    def record(line: str, headers: Mapping[str, str], fate: str) -> None:
        fates.append((line, headers["x-n"], fate))

    options = {"seed": 3, "loss": 1.0, "delay_ratio": 0.2, "reset_ratio": 0.3, "delay_s": 0.01}
    async with proxy_for(echo_server, on_request=record, **options) as proxy:
        async with httpx.AsyncClient(base_url=f"http://{LOCAL}:{proxy.port}") as client:
            for i in range(40):
                with contextlib.suppress(httpx.TransportError):
                    await client.post("/v1/transactions", content=f"r{i}", headers={"X-N": str(i)})
        stats = proxy.stats
    assert [n for _, n, _ in fates] == [str(i) for i in range(40)]
    assert {line for line, _, _ in fates} == {"POST /v1/transactions HTTP/1.1"}
    counted = Counter(fate for _, _, fate in fates)
    assert counted == {mode: n for mode, n in stats.items() if mode in counted}
    assert set(counted) == {"drop_request", "reset_before", "drop_response", "reset_after", "delay"}
    lost = {n for _, n, fate in fates if fate in ("drop_request", "reset_before")}
    arrived = {body.decode()[1:] for _, _, body in echo_server.seen}
    assert lost == {str(i) for i in range(40)} - arrived


async def test_drop_response_forwards_the_request_but_breaks_the_client_connection(
    echo_server: EchoServer,
) -> None:
    async with (
        proxy_for(echo_server, loss=1.0, drop_request_ratio=0.0) as proxy,
        httpx.AsyncClient(base_url=f"http://{LOCAL}:{proxy.port}") as client,
    ):
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            await client.post("/v1/transactions", content="pay once")
    assert echo_server.seen == [("POST", "/v1/transactions", b"pay once")]
    assert proxy.stats["drop_response"] == 1


async def test_drop_request_never_reaches_the_server(echo_server: EchoServer) -> None:
    async with (
        proxy_for(echo_server, loss=1.0, drop_request_ratio=1.0) as proxy,
        httpx.AsyncClient(base_url=f"http://{LOCAL}:{proxy.port}") as client,
    ):
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            await client.post("/v1/transactions", content="lost")
    assert echo_server.seen == []
    assert proxy.stats["drop_request"] == 1


async def test_reset_sends_a_tcp_rst(echo_server: EchoServer) -> None:
    async with (
        proxy_for(echo_server, seed=1, loss=1.0, reset_ratio=1.0) as proxy,
        httpx.AsyncClient(base_url=f"http://{LOCAL}:{proxy.port}") as client,
    ):
        results = {await outcome(client, "/r") for _ in range(10)}
    assert results == {"ReadError"}  # ECONNRESET, not a clean close
    assert proxy.stats["reset_before"] + proxy.stats["reset_after"] == 10


async def test_a_seed_replays_the_same_faults(echo_server: EchoServer) -> None:
    async def run(seed: int) -> list[str]:
        async with (
            proxy_for(echo_server, seed=seed, loss=0.5) as proxy,
            httpx.AsyncClient(base_url=f"http://{LOCAL}:{proxy.port}") as client,
        ):
            return [await outcome(client, "/s") for _ in range(40)]

    first = await run(21)
    assert await run(21) == first
    assert await run(22) != first
    assert "ok" in first and len(set(first)) > 1


async def test_hold_releases_the_original_after_the_client_gave_up(echo_server: EchoServer) -> None:
    async with proxy_for(echo_server, loss=0.0) as proxy:
        proxy.hold_next(seconds=1.0, match="POST /v1/transactions")
        async with httpx.AsyncClient(base_url=f"http://{LOCAL}:{proxy.port}") as client:
            assert (await client.get("/v1/transactions/k")).status_code == 200  # no match
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/v1/transactions", content="late original", timeout=0.2)
            assert [path for _, path, _ in echo_server.seen] == ["/v1/transactions/k"]
            await eventually_async(
                lambda: proxy.released, what="the proxy to release the held original"
            )
    assert [r.request_line for r in proxy.released] == ["POST /v1/transactions HTTP/1.1"]
    assert echo_server.seen[-1] == ("POST", "/v1/transactions", b"late original")
    assert proxy.stats["hold"] == 1


async def test_injected_faults_hit_only_matching_requests(echo_server: EchoServer) -> None:
    async with proxy_for(echo_server, loss=0.0) as proxy:
        proxy.inject("drop_response", count=2, match="POST /v1/transactions/")
        async with httpx.AsyncClient(base_url=f"http://{LOCAL}:{proxy.port}") as client:
            results = [
                await outcome(client, path)
                for path in (
                    "/other",
                    "/v1/transactions/a/abort",
                    "/v1/transactions/b/abort",
                    "/v1/transactions/c/abort",
                )
            ]
    assert results[0] == results[3] == "ok"
    assert results[1] != "ok" and results[2] != "ok"
    assert len(echo_server.seen) == 4


@pytest.fixture
def threaded_echo_server() -> Iterator[int]:
    """The echo server on its own loop in a thread, for sync callers."""
    server = EchoServer()
    loop = asyncio.new_event_loop()
    loop.run_until_complete(server.start())
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield server.port
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def test_run_in_thread_serves_sync_clients_and_stops(threaded_echo_server: int) -> None:
    handle = ChaosProxy(
        target_host=LOCAL, target_port=threaded_echo_server, loss=0.0
    ).run_in_thread()
    try:
        handle.inject("drop_request", match="/dropped")
        with httpx.Client(base_url=f"http://{LOCAL}:{handle.port}") as client:
            assert client.post("/t", content="sync").json()["body"] == "sync"
            with pytest.raises(httpx.RemoteProtocolError):
                client.post("/dropped", content="x")
        assert (handle.stats["passed"], handle.stats["drop_request"]) == (1, 1)
    finally:
        handle.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{LOCAL}:{handle.port}/t")


@pytest.mark.parametrize("host", ["10.0.0.1", "example.com", "0.0.0.0"])
def test_non_loopback_addresses_are_refused(host: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        ChaosProxy(target_host=host, target_port=80)
    with pytest.raises(ValueError, match="loopback"):
        ChaosProxy(host, 0, target_host=LOCAL, target_port=80)
    with pytest.raises(SystemExit):
        build(["--target", f"{host}:80"])


def test_the_cli_builds_the_proxy_from_flags() -> None:
    proxy = build(
        [
            "--listen",
            "127.0.0.1:0",
            "--target",
            "127.0.0.1:9",
            "--loss",
            "0.1",
            "--seed",
            "4",
            "--reset-ratio",
            "0.5",
        ]
    )
    assert (proxy.target_port, proxy.loss, proxy.seed) == (9, 0.1, 4)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_the_cli_runs_until_interrupted(threaded_echo_server: int, inherited: str) -> None:
    """SIGINT stops it and it prints its stats — also when it inherited SIGINT ignored, as a
    command started with ``&`` by a non-interactive shell does (asyncio.run alone then never
    sees the interrupt)."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "idempay_tools.chaos_proxy",
            "--listen",
            "127.0.0.1:0",
            "--target",
            f"127.0.0.1:{threaded_echo_server}",
            "--loss",
            "0",
            "--seed",
            "1",
        ],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint if inherited == "ignored" else None,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        port = int(re.search(r"127\.0\.0\.1:(\d+) ->", line).group(1))  # type: ignore[union-attr]
        assert httpx.post(f"http://{LOCAL}:{port}/cli", content="hi").json()["body"] == "hi"
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=30)
    finally:
        process.kill()
    assert "'passed': 1" in rest
