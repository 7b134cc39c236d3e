"""Work the chaos harness runs beside the fleet: the lake export and the noisy neighbour.

- ``Exporter``: ``idempay export --date D --lake LAKE`` for every UTC day of the run, one
  after the other for as long as the fleet sells (so exports overlap every fault), and a
  final one after the API has stopped and flushed its request events. A failed export
  (PostgreSQL down, a restore) is counted, not fatal: the next one retries the day. Each
  export is a process of its own session, registered by PID, and bounded: by
  ``EXPORT_TIMEOUT_S``, and by the phase's time left (``Tracker``); ``stop()`` ends the
  loop's export in flight (SIGTERM, then SIGKILL) instead of waiting for it.
- ``NoisyNeighbour``: one merchant floods the API with ``tok_issuer_down`` creates from
  ``connections`` threads (the acquirer never answers them: each key holds its 0200 until
  the acquirer timeout, then settles in doubt with a reversal advice queued), while a victim
  merchant sends ``tok_issuer_timeout`` payments (the acquirer approves and never answers the
  first 0200: in doubt too, declined ``acquirer_timeout``) and follows each by lookup.
  contract §2: every victim payment must end — approved or declined, final — within the
  deadline, whatever the flood does, counted from the victim's first create. The run's
  schedule keeps every acquirer episode out of the flood and its victims' time
  (``chaos.NEEDS_ACQUIRER``), so an "Acquirer unreachable" answer here is the server's
  doing, not an episode's: it is counted (``unreachable``) and the clock is not reset.

Both talk straight to the API (not through the chaos proxy): the link's faults are the
fleet's business; these measure the server.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import httpx

from idempay_tools._chaos_services import Tracker

ROOT = Path(__file__).resolve().parents[1]
EXPORT_TIMEOUT_S = 120.0


def run_days(started_at: datetime, now: datetime | None = None) -> list[date]:
    """Every UTC day from the run's start to now (a run may cross midnight)."""
    first, last = started_at.date(), (now or datetime.now(UTC)).date()
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


class Exporter:
    """``idempay export`` in a loop beside the fleet, then once more at the end."""

    def __init__(
        self,
        env: Mapping[str, str],
        lake: Path,
        log: Path,
        *,
        pause_s: float = 2.0,
        tracker: Tracker | None = None,
    ):
        self.env, self.lake, self.log, self.pause_s = dict(env), lake, log, pause_s
        self.tracker = tracker
        self.started_at = datetime.now(UTC)
        self.runs: Counter[str] = Counter()  # ok / failed / timed_out
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="exporter", daemon=True)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.started_at = datetime.now(UTC)
        self._thread.start()

    def stop(self, *, timeout: float = 15.0) -> bool:
        """End the loop: its export in flight is stopped, not waited for (the final
        export runs afterwards). False when the loop did not end within ``timeout``."""
        self._stop.set()
        self._end_current()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def export(self, *, cap: float = EXPORT_TIMEOUT_S) -> bool:
        """One export of every day of the run; True when each day's export succeeded
        (each within ``cap`` and the phase's time left)."""
        ok = True
        for day in run_days(self.started_at):
            ok = self._export_day(day, cap) and ok
        return ok

    def _end_current(self) -> None:
        with self._lock:
            proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def _export_day(self, day: date, cap: float) -> bool:
        argv = [sys.executable, "-m", "api", "export", "--date", day.isoformat()]
        argv += ["--lake", str(self.lake)]
        timeout = self.tracker.left(cap) if self.tracker is not None else cap
        if self.tracker is not None and self.tracker.closing.is_set():
            return False
        if timeout <= 0:  # the phase has no time left for it
            self.runs["timed_out"] += 1
            return False
        with self.log.open("a") as log:
            log.write(f"--- {datetime.now(UTC).isoformat()} export {day} (≤ {timeout:.0f} s)\n")
            log.flush()
            with self._lock:
                if self._stop.is_set() and threading.current_thread() is self._thread:
                    return False
                proc = self._proc = subprocess.Popen(
                    argv, cwd=ROOT, env={**os.environ, **self.env}, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
                if self.tracker is not None:
                    self.tracker.registry.add(proc.pid, f"export {day}", group=True)
            try:
                ok = proc.wait(timeout) == 0
                outcome = "ok" if ok else "failed"
            except subprocess.TimeoutExpired:
                ok, outcome = False, "timed_out"
                self._end_current()
                log.write(f"--- export {day} stopped after {timeout:.0f} s\n")
            finally:
                with self._lock:
                    self._proc = None
        if not (self._stop.is_set() and threading.current_thread() is self._thread):
            self.runs[outcome] += 1  # an export the stop cut short is not counted
        return ok

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.export()
            self._stop.wait(self.pause_s)


def _acquirer_unreachable(answer: httpx.Response) -> bool:
    """A 503 whose problem says the acquirer could not be reached (no 0200 left)."""
    try:
        return "Acquirer unreachable" in str(answer.json().get("title", ""))
    except ValueError:
        return False


@dataclass
class Victim:
    key: str
    sent: float  # monotonic
    status: str = "unsettled"  # approved | declined | aborted | expired | unsettled
    finished: float | None = None
    unreachable: int = 0  # creates answered 503 "Acquirer unreachable" (retried)

    @property
    def seconds(self) -> float | None:
        return None if self.finished is None else self.finished - self.sent


_DOWN = {"token": "tok_issuer_down", "last4": "0000", "brand": "visa"}
_TIMEOUT = {"token": "tok_issuer_timeout", "last4": "0001", "brand": "visa"}


def _body(card: dict[str, str], terminal: str) -> dict[str, object]:
    return {"terminal_id": terminal, "amount": 1000, "currency": "BRL", "card": card}


@dataclass
class NoisyNeighbour:
    """A flood of ``tok_issuer_down`` creates from one merchant; victims of another."""

    base_url: str
    noisy_key: str
    victim_key: str
    deadline_s: float  # the server's issuer deadline
    connections: int = 45
    victims: int = 6
    flood_sent: Counter[str] = field(default_factory=Counter)
    results: list[Victim] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _until: float = math.inf

    def run(self, hold_s: float, *, until: float = math.inf) -> float:
        """Flood for ``hold_s`` while the victims pay; wait for every victim to end (at most
        the deadline and a margin, and never past ``until``, monotonic: the victims still
        pending then stay ``unsettled``). Returns the monotonic time the flood stopped."""
        self._until = until
        stop = threading.Event()
        began = time.monotonic()
        flood = [
            threading.Thread(target=self._flood, args=(stop,), daemon=True)
            for _ in range(self.connections)
        ]
        for thread in flood:
            thread.start()
        time.sleep(hold_s / 4)  # the flood first fills the completer
        victims = [
            threading.Thread(target=self._victim, args=(i,), daemon=True)
            for i in range(self.victims)
        ]
        for thread in victims:  # spread over the middle half of the flood
            thread.start()
            time.sleep(hold_s / 2 / self.victims)
        stop.wait(max(0.0, began + hold_s - time.monotonic()))
        stop.set()
        stopped = time.monotonic()
        end = min(stopped + self.deadline_s + 45.0, until)
        for thread in [*flood, *victims]:  # one deadline for all of them, not one each
            thread.join(max(0.0, end - time.monotonic()))
        return stopped

    def _flood(self, stop: threading.Event) -> None:
        headers = {"Authorization": f"Bearer {self.noisy_key}"}
        with httpx.Client(base_url=self.base_url, headers=headers, timeout=30.0) as http:
            while not stop.is_set():
                try:
                    answer = http.post(
                        "/v1/transactions",
                        json=_body(_DOWN, "NOISY-1"),
                        headers={"Idempotency-Key": str(uuid.uuid4())},
                    )
                    outcome = str(answer.status_code)
                except httpx.HTTPError as exc:
                    outcome = type(exc).__name__
                with self._lock:
                    self.flood_sent[outcome] += 1

    def _victim(self, index: int) -> None:
        victim = Victim(key=str(uuid.uuid4()), sent=time.monotonic())
        with self._lock:
            self.results.append(victim)
        headers = {"Authorization": f"Bearer {self.victim_key}"}
        until = min(victim.sent + self.deadline_s + 30.0, self._until)
        created = False
        with httpx.Client(base_url=self.base_url, headers=headers, timeout=15.0) as http:
            while time.monotonic() < until:
                try:
                    if not created:
                        answer = http.post(
                            "/v1/transactions",
                            json=_body(_TIMEOUT, f"VICTIM-{index}"),
                            headers={"Idempotency-Key": victim.key},
                        )
                        created = answer.status_code in (201, 202, 409)
                        if answer.status_code == 503 and _acquirer_unreachable(answer):
                            victim.unreachable += 1  # retried; its deadline still runs
                    else:
                        answer = http.get(f"/v1/transactions/{victim.key}")
                except httpx.HTTPError:
                    time.sleep(0.5)
                    continue
                if answer.status_code in (200, 201):
                    victim.status, victim.finished = answer.json()["status"], time.monotonic()
                    return
                if answer.status_code == 410:
                    state = answer.headers.get("idempotency-status", "aborted")
                    victim.status, victim.finished = state, time.monotonic()
                    return
                time.sleep(0.25)

    def late_or_lost(self) -> list[Victim]:
        """Victims not final (approved or declined) within the deadline: each a violation."""
        return [
            v
            for v in self.results
            if v.status not in ("approved", "declined")
            or v.seconds is None
            or v.seconds > self.deadline_s
        ]
