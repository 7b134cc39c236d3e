"""The host's control socket: loopback TCP, one JSON object per line, one JSON answer per
line (the protocol is in :mod:`api.acquirer.host.faults`; :func:`faults.control` is the
client)."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import structlog

from api.acquirer.host.faults import FaultError

if TYPE_CHECKING:
    from api.acquirer.host.server import AcquirerHost

__all__ = ["ControlServer"]

log = structlog.get_logger("acquirer")
_LOOPBACK = "127.0.0.1"


class ControlServer:
    def __init__(self, host: AcquirerHost, port: int) -> None:
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, _LOOPBACK, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write(json.dumps(await self.handle(line)).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, OSError, ValueError):  # ValueError: a line over the limit
            pass
        finally:
            writer.close()

    async def handle(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise FaultError("a request is one JSON object")
            changes: dict[str, Any] = {}
            if "set" in request:
                if not isinstance(request["set"], dict):
                    raise FaultError('"set" takes an object of fault settings')
                changes.update(request["set"])
            if "down" in request:
                changes["down"] = request["down"]
            unknown = set(request) - {"set", "down", "get"}
            if unknown:
                raise FaultError(f"unknown request {sorted(unknown)}")
            if changes:
                await self.host.set_faults(self.host.faults.changed(changes))
                log.info("acquirer.faults", **self.host.faults.as_dict())
        except (FaultError, ValueError, OSError) as exc:  # OSError: the port is taken
            return {"ok": False, "error": str(exc)}
        return {
            "ok": True,
            "faults": self.host.faults.as_dict(),
            "connections": self.host.connections,
            "port": self.host.port,
        }
