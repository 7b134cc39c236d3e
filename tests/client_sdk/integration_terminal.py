"""A terminal process for the kill tests: ``pay`` one card, ``pay-offline`` one card while
the server cannot be reached, or ``recover`` a journal.

    python integration_terminal.py pay URL API_KEY JOURNAL [--gate]
    python integration_terminal.py pay-offline URL API_KEY JOURNAL
    python integration_terminal.py recover URL API_KEY JOURNAL

``--gate`` routes the payment through a ``FaultTransport`` that delays every request
for ten minutes *before* sending it, so the process can be killed with its journal entry
written (SENT) and nothing on the wire. Only the payment's requests: the clock check the
SDK makes before its first payment (``GET /healthz``) passes, else the entry would never
be written. ``recover`` prints one JSON line per entry it
settled: ``{"key", "state", "status"}``. ``pay-offline`` (URL: a port nobody listens on)
sells under an offline policy, prints ``{"key", "status", "offline"}`` once the journal
holds the payment STORED, then waits to be killed.

The tests start it with ``terminal(...)``, end it with ``killed(...)`` and run a reboot's
``recover`` with ``recovered(...)`` (the launcher the kill tests share).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from client_sdk import Client, OfflinePolicy, RetryPolicy
from client_sdk.faults import FaultTransport

CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}
GATE_S = 600.0
POLICY = OfflinePolicy(
    floor_limit=10_000, max_stored_count=10, max_stored_amount=50_000, max_age_s=3600
)


def terminal(*args: str) -> subprocess.Popen[str]:
    """This program in a process of its own: ``args`` is its command line (above)."""
    return subprocess.Popen(
        [sys.executable, str(Path(__file__)), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def killed(process: subprocess.Popen[str]) -> None:
    """SIGKILL ``process`` (no chance to clean up) and check that is how it ended."""
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    assert process.returncode == -signal.SIGKILL


def recovered(url: str, api_key: str, journal: Path) -> list[dict[str, object]]:
    """Run ``recover`` on ``journal`` in a new process (a reboot): one line per entry."""
    process = terminal("recover", url, api_key, str(journal))
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return [json.loads(line) for line in out.splitlines()]


class Gate(httpx.BaseTransport):
    """Holds every request but the clock check for ``GATE_S`` before sending it."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self._inner = inner
        self._held = FaultTransport(inner, delay=1.0, delay_s=GATE_S)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            return self._inner.handle_request(request)
        return self._held.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def main(argv: list[str]) -> None:
    command, url, api_key, journal = argv[:4]
    transport: httpx.BaseTransport = httpx.HTTPTransport()
    if "--gate" in argv:
        transport = Gate(transport)
    with Client(
        url,
        api_key,
        terminal_id="T-KILL",
        journal=journal,
        timeout=5.0,
        transport=transport,
        retry=RetryPolicy(base=0.02, cap=0.2),
        offline=POLICY if command == "pay-offline" else None,
    ) as pos:
        if command == "pay-offline":
            sold = pos.purchase(amount=4200, currency="BRL", card=CARD, deadline_s=60)
            line = {"key": sold.id, "status": sold.status, "offline": sold.offline}
            print(json.dumps(line), flush=True)
            time.sleep(GATE_S)  # killed here: stored, not forwarded
            return
        if command == "pay":
            result = pos.purchase(amount=4200, currency="BRL", card=CARD, deadline_s=60)
            print(json.dumps({"key": result.id, "status": result.status}), flush=True)
            return
        for item in pos.recover():
            status = item.transaction.status if item.transaction else None
            line = {"key": item.key, "state": str(item.state), "status": status}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
