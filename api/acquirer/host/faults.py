"""Fault injection for the acquirer host, set by flags and switchable while it runs.

The faults apply to the financial messages (0200, 0400, 0420, 0421); network management
(0800) is only affected by ``down``, so a link can always sign on to an ``up`` host.

=====================  ========================================================================
``latency_ms``         every answer waits this long after its decision is committed …
``jitter_ms``          … plus a uniform 0..jitter_ms
``drop_answer``        probability: decide and store, never answer
``late_answer``        probability: decide and store, answer after ``late_seconds``
``late_seconds``       how late a late answer is (default 20 s: past the link's timeout)
``drop_connection``    probability: close the connection after receiving a message …
``drop_when``          … ``before`` deciding (recorded, no decision) or ``after`` (decided and
                       stored, no answer); ``either`` picks one at random
``down``               refuse connections (the listener is closed) and close every open one
=====================  ========================================================================

Control at run time: ``--control-port P`` opens a loopback TCP socket reading one JSON
object per line — ``{"set": {"drop_answer": 0.1}}``, ``{"down": true}``, ``{"down":
false}``, ``{"get": true}`` — each answered by one JSON line: ``{"ok": true, "faults":
{...}, "connections": N}`` (or ``{"ok": false, "error": "..."}``). SIGUSR1 is ``down``,
SIGUSR2 ``up``. :func:`control` is the client. Every random choice comes from one RNG
seeded by ``--seed``.
"""

from __future__ import annotations

import json
import random
import socket
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

__all__ = ["FaultError", "Faults", "Plan", "control", "plan"]

_WHEN = ("before", "after", "either")


class FaultError(ValueError):
    """A fault setting that does not exist or is out of range."""


@dataclass(frozen=True, slots=True)
class Faults:
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    drop_answer: float = 0.0
    late_answer: float = 0.0
    late_seconds: float = 20.0
    drop_connection: float = 0.0
    drop_when: str = "either"
    down: bool = False

    def __post_init__(self) -> None:
        for name in ("drop_answer", "late_answer", "drop_connection"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise FaultError(f"{name} must be a probability in [0, 1], got {value!r}")
        for name in ("latency_ms", "jitter_ms", "late_seconds"):
            if getattr(self, name) < 0:
                raise FaultError(f"{name} must be ≥ 0")
        if self.drop_when not in _WHEN:
            raise FaultError(f"drop_when must be one of {', '.join(_WHEN)}")

    def changed(self, changes: dict[str, Any]) -> Faults:
        """A copy with ``changes`` applied (names and types checked)."""
        known = {f.name: f for f in fields(self)}
        typed: dict[str, Any] = {}
        for name, value in changes.items():
            if name not in known:
                raise FaultError(f"unknown fault setting {name!r}")
            if name == "down":
                if not isinstance(value, bool):
                    raise FaultError("down must be true or false")
                typed[name] = value
            elif name == "drop_when":
                typed[name] = str(value)
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise FaultError(f"{name} must be a number")
            else:
                typed[name] = float(value)
        return replace(self, **typed)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Plan:
    """What the faults do to one financial message, drawn when it arrives."""

    delay: float = 0.0  # seconds between the committed decision and the answer
    drop_answer: bool = False
    drop_connection: str | None = None  # "before" | "after" deciding


def plan(faults: Faults, rng: random.Random) -> Plan:
    if faults.drop_connection and rng.random() < faults.drop_connection:
        when = faults.drop_when
        if when == "either":
            when = rng.choice(("before", "after"))
        return Plan(drop_connection=when)
    if faults.drop_answer and rng.random() < faults.drop_answer:
        return Plan(drop_answer=True)
    delay = (faults.latency_ms + rng.uniform(0.0, faults.jitter_ms)) / 1000.0
    if faults.late_answer and rng.random() < faults.late_answer:
        delay += faults.late_seconds
    return Plan(delay=delay)


def control(host: str, port: int, *, timeout: float = 5.0, **changes: Any) -> dict[str, Any]:
    """Change the host's faults (``down=True`` / ``down=False`` included) and return its
    state; with no changes, only read it. Raises :class:`FaultError` when refused."""
    request: dict[str, Any] = {"set": changes} if changes else {"get": True}
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    answer: dict[str, Any] = json.loads(data)
    if not answer.get("ok"):
        raise FaultError(str(answer.get("error")))
    return answer
