"""Work the chaos harness runs beside the fleet: the lake export and the noisy neighbour.

- ``Exporter``: ``idempay export --date D --lake LAKE`` for every UTC day of the run, one
  after the other for as long as the fleet sells (so exports overlap every fault), and a
  final one after the API has stopped and flushed its request events. A failed export
  (PostgreSQL down, a restore) is counted, not fatal: the next one retries the day.
- ``NoisyNeighbour``: one merchant floods the API with ``tok_issuer_down`` creates from
  ``connections`` threads (each key holds an issuer call until its timeout, then the
  completer re-drives it until the issuer deadline voids it), while a victim merchant sends
  ``tok_issuer_timeout`` payments (the first issuer call times out, the completer finishes
  the key about a second after the 202) and follows each by lookup. contract §2: every victim
  payment must end approved, within the issuer deadline, whatever the flood does.

Both talk straight to the API (not through the chaos proxy): the link's faults are the
fleet's business; these measure the server.
"""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[1]
EXPORT_TIMEOUT_S = 120.0


def run_days(started_at: datetime, now: datetime | None = None) -> list[date]:
    """Every UTC day from the run's start to now (a run may cross midnight)."""
    first, last = started_at.date(), (now or datetime.now(UTC)).date()
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


class Exporter:
    """``idempay export`` in a loop beside the fleet, then once more at the end."""

    def __init__(self, env: Mapping[str, str], lake: Path, log: Path, *, pause_s: float = 2.0):
        self.env, self.lake, self.log, self.pause_s = dict(env), lake, log, pause_s
        self.started_at = datetime.now(UTC)
        self.runs: Counter[str] = Counter()  # ok / failed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="exporter", daemon=True)

    def start(self) -> None:
        self.started_at = datetime.now(UTC)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(EXPORT_TIMEOUT_S + 10)

    def export(self) -> bool:
        """One export of every day of the run; True when each day's export succeeded."""
        ok = True
        for day in run_days(self.started_at):
            ok = self._export_day(day) and ok
        return ok

    def _export_day(self, day: date) -> bool:
        import os

        argv = [sys.executable, "-m", "api", "export", "--date", day.isoformat()]
        argv += ["--lake", str(self.lake)]
        with self.log.open("a") as log:
            log.write(f"--- {datetime.now(UTC).isoformat()} export {day}\n")
            log.flush()
            try:
                done = subprocess.run(
                    argv, cwd=ROOT, env={**os.environ, **self.env}, stdout=log,
                    stderr=subprocess.STDOUT, timeout=EXPORT_TIMEOUT_S, check=False,
                )  # fmt: skip
                ok = done.returncode == 0
            except subprocess.TimeoutExpired:
                ok = False
        self.runs["ok" if ok else "failed"] += 1
        return ok

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.export()
            self._stop.wait(self.pause_s)


@dataclass
class Victim:
    key: str
    sent: float  # monotonic
    status: str = "unsettled"  # approved | declined | aborted | expired | unsettled
    finished: float | None = None

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

    def run(self, hold_s: float) -> float:
        """Flood for ``hold_s`` while the victims pay; wait for every victim to end (at most
        the deadline and a margin). Returns the monotonic time the flood stopped."""
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
        for thread in [*flood, *victims]:
            thread.join(self.deadline_s + 60)
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
        until = victim.sent + self.deadline_s + 30.0
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
        """Victims not approved within the deadline: each one a violation."""
        return [
            v
            for v in self.results
            if v.status != "approved" or v.seconds is None or v.seconds > self.deadline_s
        ]
