"""What the bench database's backends are doing, sampled from ``pg_stat_activity``.

A background thread polls every 50 ms and files each backend of the bench database under
the scenario running at that moment: ``active`` (on CPU or runnable), a wait event such as
``Lock:transactionid`` (waiting for another transaction's row lock), ``IO:WALSync``,
``idle in transaction`` (Postgres is waiting for the application), or ``idle`` (a pooled
connection with nothing to do). Averages are backends per sample.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, defaultdict

import asyncpg

_QUERY = """
SELECT state, wait_event_type, wait_event FROM pg_stat_activity
WHERE datname = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()
"""
INTERVAL_S = 0.05


def _label(state: str | None, wait_type: str | None, wait_event: str | None) -> str:
    if state == "active":
        return f"{wait_type}:{wait_event}" if wait_type else "active"
    return state or "unknown"


class WaitSampler:
    def __init__(self, dsn: str, database: str) -> None:
        self.dsn = dsn
        self.database = database
        self.scenario: str | None = None
        self.samples: Counter[str] = Counter()
        self.states: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg-waits", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.run(self._poll())

    async def _poll(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            while not self._stop.is_set():
                scenario = self.scenario
                rows = await conn.fetch(_QUERY, self.database)
                if scenario is not None and scenario == self.scenario:
                    self.samples[scenario] += 1
                    for row in rows:
                        label = _label(row["state"], row["wait_event_type"], row["wait_event"])
                        self.states[scenario][label] += 1
                await asyncio.sleep(INTERVAL_S)
        finally:
            await conn.close()

    def summary(self, scenario: str, n: int = 4) -> list[tuple[str, float]]:
        """The ``n`` commonest non-idle states: mean backends in that state per sample."""
        samples = self.samples.get(scenario, 0)
        if not samples:
            return []
        busy = Counter({k: v for k, v in self.states[scenario].items() if k != "idle"})
        return [(label, count / samples) for label, count in busy.most_common(n)]
