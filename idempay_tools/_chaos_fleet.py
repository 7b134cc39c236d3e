"""The chaos harness's terminals and its probe.

Each terminal is its own process (``python -m idempay_tools._chaos_fleet SPEC``) running
``idempay_tools.simulate.Terminal`` — one ``client_sdk.Client`` with its own journal — through the
chaos proxy: on start it ``recover()``s what its journal holds in doubt (a reboot after a
SIGKILL), then sells one payment after another until the harness's stop file appears,
then settles its journal and exits. It prints one JSON line per payment the SDK reported
(``{"key", "status"}``), ``{"booted": true}`` once its recovery is done, and its round-trip
counts at the end.

``TerminalProcess`` supervises one terminal from a thread: ``kill()`` SIGKILLs it and a
new process starts on the same journal after ``reboot_delay_s``. Each process runs in a
session of its own (a Ctrl-C to the harness does not kill it mid-write: the harness stops
it) and is registered by PID (``idempay_tools._chaos_services.Tracker``); none is started
once the run is closing, and a terminal whose harness has gone (its parent changed) stops
selling and exits.

Under an offline policy (the link-outage phase, ``idempay_tools._chaos_outage``) each line
also says whether the SDK accepted the payment offline (``"offline": true``) and the
terminal's risk counters after it (``"exposure": [stored count, stored amount]``, from the
journal), a boot in the outage recovers what it can and sells on without waiting for
the link, and what became of every payment its journal holds sold offline (forwarded:
the server's status; ``refused``; ``stored``) is reported at boot and at the end — also
those a killed process had sold, which the SDK forwards before a later sale.

``Probe`` sends a create straight to the API (not through the proxy) every
``interval_s``, for the time-to-recover figures: a probe succeeds when the create answers
201 or 202 within its timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from idempay_tools._chaos_lake import ProbeCreate
from idempay_tools._chaos_outage import advice_status, is_advice
from idempay_tools._chaos_services import Tracker
from idempay_tools.simulate import FleetConfig, Terminal

ROOT = Path(__file__).resolve().parents[1]


class Tally:
    """What every terminal reported, thread-safe: key → last status the SDK reported (and
    when); payments whose journal failed under them (``storage_error``: a raw storage
    error out of the SDK; ``journal_error``: the SDK's own) by terminal."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outcomes: dict[str, str] = {}
        self.when: dict[str, float] = {}  # key → monotonic time of the report
        self.terminal_of: dict[str, str] = {}  # key → the terminal that reported it
        self.counts: Counter[str] = Counter()
        self.completed: list[float] = []  # monotonic time of each payment the SDK settled
        self.by_terminal: dict[str, list[float]] = {}
        self.journal_failures: list[tuple[str, str, str]] = []  # (terminal, key, kind)
        self.offline: dict[str, str] = {}  # key → terminal: the SDK accepted it offline
        self.exposure: dict[str, list[tuple[float, int, int]]] = {}  # terminal → (t, n, amount)

    def exposed(self, terminal: str, count: int, amount: int) -> None:
        """The terminal's offline risk counters, as it reported them after a sale or boot."""
        with self._lock:
            self.exposure.setdefault(terminal, []).append((time.monotonic(), count, amount))

    def record(self, key: str, status: str, terminal: str = "", *, offline: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if offline and key:
                self.offline[key] = terminal
            if status in ("storage_error", "journal_error"):
                self.journal_failures.append((terminal, key, status))
                if not key:
                    return
            self.outcomes[key] = status
            self.when[key] = now
            self.terminal_of[key] = terminal
            self.completed.append(now)
            self.by_terminal.setdefault(terminal, []).append(now)

    def merge(self, counts: dict[str, int]) -> None:
        with self._lock:
            self.counts.update(counts)


@dataclass
class TerminalProcess:
    """One terminal, run as a process and restarted on its journal after a kill."""

    config: FleetConfig
    index: int
    stop_file: Path
    tally: Tally
    tracker: Tracker | None = None
    think_s: float = 0.05
    reboot_delay_s: float = 1.0
    kills: int = 0
    unexpected_exits: list[str] = field(default_factory=list)
    booted_at: float = 0.0
    _proc: subprocess.Popen[str] | None = None
    _killed: bool = False
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def terminal_id(self) -> str:
        return self.config.terminal_id(self.index)

    @property
    def journal(self) -> Path:
        return self.config.journal(self.index)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._supervise, name=self.terminal_id, daemon=True)
        self._thread.start()

    def kill(self) -> float:
        """SIGKILL the running process (it is rebooted); the monotonic time of the kill."""
        with self._lock:
            proc = self._proc
            self._killed = True
            self.booted_at = 0.0
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        return time.monotonic()

    def join(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(max(0.0, timeout))
            return not self._thread.is_alive()
        return True

    @property
    def pid(self) -> int | None:
        with self._lock:
            proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def limit_journal(self, size: int | None) -> int | None:
        """RLIMIT_FSIZE of the running process: no file it writes grows past ``size`` bytes
        (the journal's disk is full); ``None`` lifts it. The pid, or None when not running."""
        with self._lock:
            proc = self._proc
        if proc is None or proc.poll() is not None:
            return None
        limit = resource.RLIM_INFINITY if size is None else size
        try:
            resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        except (ProcessLookupError, PermissionError):
            return None
        return proc.pid

    def settled_since(self, moment: float) -> float | None:
        """The first payment this terminal settled at or after ``moment``."""
        return next(
            (t for t in self.tally.by_terminal.get(self.terminal_id, []) if t >= moment), None
        )

    def terminate(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()

    def _closing(self) -> bool:
        return self.tracker is not None and self.tracker.closing.is_set()

    def _supervise(self) -> None:
        reboot = False
        while not self._closing():
            self._run_once(reboot=reboot)
            with self._lock:
                killed, self._killed = self._killed, False
                code = self._proc.returncode if self._proc is not None else None
            if self._closing():
                return
            if killed:
                time.sleep(self.reboot_delay_s)
                reboot = True
                continue
            if code != 0:
                self.unexpected_exits.append(f"{self.terminal_id} exited with {code}")
                if not self.stop_file.exists():
                    reboot = True
                    continue
            return

    def _run_once(self, *, reboot: bool) -> None:
        spec = {
            "fleet": self.config.to_json(),
            "index": self.index,
            "stop_file": str(self.stop_file),
            "think_s": self.think_s,
            "reboot": reboot,
        }
        with self._lock:
            if self._closing():
                return
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "idempay_tools._chaos_fleet", json.dumps(spec)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            proc = self._proc
            if self.tracker is not None:
                self.tracker.registry.add(proc.pid, self.terminal_id)
        assert proc.stdout is not None
        last: dict[str, Any] = {}
        for line in proc.stdout:
            with contextlib.suppress(ValueError):
                last = json.loads(line)
            if "key" in last:
                offline = bool(last.get("offline"))
                self.tally.record(last["key"], last["status"], self.terminal_id, offline=offline)
            if "exposure" in last:
                self.tally.exposed(self.terminal_id, *last["exposure"])
            if last.get("booted"):
                self.booted_at = time.monotonic()
            if "counts" in last:
                self.tally.merge(last["counts"])
        proc.stdout.close()
        proc.wait()


def _child(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full disk fails the write, not us
    config = FleetConfig.from_json(spec["fleet"])
    stop_file = Path(spec["stop_file"])
    rng = random.Random(f"{config.seed}:{spec['index']}:think:{spec['reboot']}")

    def emit(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    parent = os.getppid()
    with contextlib.closing(Terminal(config, spec["index"], rebooted=spec["reboot"])) as pos:
        offline = pos.client.offline is not None

        def exposure() -> dict[str, Any]:
            if not offline:
                return {}
            counters = pos.client.journal.offline_exposure()
            return {"exposure": [counters.count, sum(counters.amounts.values())]}

        def sold_offline() -> dict[str, str]:
            if not offline:
                return {}
            entries = pos.client.journal.entries()
            return {e.key: advice_status(e) for e in entries if is_advice(e)}

        # recover() what a kill left in doubt; in the outage, without waiting for the link
        settled = pos.settle(wait_for_link=False)
        settled.update(sold_offline())
        for key, status in settled.items():
            emit({"key": key, "status": status, "boot": True})
        emit({"booted": True, **exposure()})
        while not stop_file.exists() and os.getppid() == parent:
            offline_before = pos.counts["offline_sales"]
            key, status = pos.sell()
            emit(
                {
                    "key": key,
                    "status": status,
                    "offline": pos.counts["offline_sales"] > offline_before,
                    **exposure(),
                }
            )
            time.sleep(rng.uniform(0.0, spec["think_s"]))
        if os.getppid() != parent:  # the harness is gone: nobody reads us any more
            return
        settled = pos.settle()
        settled.update(sold_offline())
        for key, status in settled.items():
            emit({"key": key, "status": status})
        emit({"counts": dict(pos.counts), "done": True, **exposure()})


class Probe:
    """A create straight to the API every ``interval_s``; (monotonic time, ok) per try."""

    def __init__(self, base_url: str, api_key: str, *, interval_s: float = 0.25) -> None:
        self.base_url, self.interval_s = base_url, interval_s
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self.results: list[tuple[float, bool]] = []
        self.keys: list[str] = []
        self.creates: list[ProbeCreate] = []  # for the request-event checks
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def first_success_after(self, moment: float) -> float | None:
        return next((t for t, ok in list(self.results) if ok and t >= moment), None)

    def failures_between(self, start: float, end: float) -> int:
        return sum(1 for t, ok in list(self.results) if not ok and start <= t <= end)

    def _run(self) -> None:
        body = {
            "terminal_id": "PROBE-1",
            "amount": 100,
            "currency": "BRL",
            "card": {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"},
        }
        with httpx.Client(base_url=self.base_url, timeout=3.0, headers=self._headers) as http:
            while not self._stop.wait(self.interval_s):
                key = str(uuid.uuid4())
                self.keys.append(key)
                started = time.monotonic()
                answered, status, answered_at = False, None, None
                try:
                    answer = http.post(
                        "/v1/transactions", json=body, headers={"Idempotency-Key": key}
                    )
                    ok, answered = answer.status_code in (201, 202), True
                    status, answered_at = answer.status_code, time.monotonic()
                except httpx.HTTPError:
                    ok = False
                self.results.append((started, ok))
                self.creates.append(ProbeCreate(key, started, answered, status, answered_at))

    def settle(self, *, timeout: float = 90.0, parallel: int = 8) -> dict[str, int]:
        """Give every probe key a definitive state: processed, or fenced by abort (``parallel``
        keys at a time); the keys not settled when ``timeout`` is spent are counted
        ``unsettled``."""
        deadline = time.monotonic() + timeout
        with (
            httpx.Client(base_url=self.base_url, timeout=5.0, headers=self._headers) as http,
            ThreadPoolExecutor(parallel, thread_name_prefix="probe-settle") as pool,
        ):
            states = list(pool.map(lambda key: self._settle_key(http, key, deadline), self.keys))
        return dict(Counter(states))

    @staticmethod
    def _settle_key(http: httpx.Client, key: str, deadline: float) -> str:
        while time.monotonic() < deadline:
            try:
                found = http.get(f"/v1/transactions/{key}")
                if found.status_code == 404:
                    found = http.post(f"/v1/transactions/{key}/abort")
            except httpx.HTTPError:
                time.sleep(0.5)
                continue
            if found.status_code in (200, 410):
                return str(found.headers.get("idempotency-status", "?"))
            time.sleep(0.5)
        return "unsettled"


if __name__ == "__main__":
    _child(sys.argv[1:])
