"""Garbage-collector pauses in a server process, for ``loadtest/tail_probe.py``.

``install(path)`` adds a ``gc.callbacks`` hook timing every collection (per generation:
count, total and longest pause, pauses over 5 ms) and writes the summary to ``path`` as
JSON when the process exits (uvicorn's graceful shutdown runs ``atexit``) and on
``SIGUSR1``; ``SIGUSR2`` resets it. Measurement only: nothing in ``api/`` imports it.
"""

from __future__ import annotations

import atexit
import gc
import json
import signal
import time
from pathlib import Path
from typing import Any


class GcTrace:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.started = 0.0
        self.stats: dict[int, dict[str, float]] = {
            gen: {"count": 0, "total_ms": 0.0, "max_ms": 0.0, "over_5ms": 0, "collected": 0}
            for gen in range(3)
        }
        self.began = time.monotonic()
        self.full: list[tuple[float, float]] = []  # (seconds since reset, pause ms) of gen 2

    def reset(self, *_args: Any) -> None:
        """Forget what start-up collected (the probe calls it after its warm-up)."""
        for row in self.stats.values():
            for name in row:
                row[name] = 0
        self.full.clear()
        self.began = time.monotonic()

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        pause = (time.perf_counter() - self.started) * 1000.0
        row = self.stats[info["generation"]]
        row["count"] += 1
        row["total_ms"] += pause
        row["max_ms"] = max(row["max_ms"], pause)
        row["over_5ms"] += pause > 5.0
        row["collected"] += info.get("collected", 0)
        if info["generation"] == 2:
            self.full.append((round(time.monotonic() - self.began, 3), round(pause, 2)))

    def dump(self, *_args: Any) -> None:
        summary = {
            "seconds": time.monotonic() - self.began,
            "threshold": gc.get_threshold(),
            "frozen": gc.get_freeze_count(),
            "generations": {str(gen): row for gen, row in self.stats.items()},
            "full": self.full,
        }
        self.path.write_text(json.dumps(summary, indent=2) + "\n")


def install(path: str) -> GcTrace:
    trace = GcTrace(Path(path))
    gc.callbacks.append(trace)
    atexit.register(trace.dump)
    signal.signal(signal.SIGUSR1, trace.dump)
    signal.signal(signal.SIGUSR2, trace.reset)
    return trace
