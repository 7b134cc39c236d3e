"""``--profile``: garbage-collector pauses in the create server while py-spy samples it.

py-spy does not see the collector: a pause is charged to whatever frame allocated. With
``LOADTEST_GC_TRACE=path`` in its environment the bench's server (``loadtest/_bench_app.py``,
one worker: the factory runs in the serving process) calls ``install(path)``, which adds a
``gc.callbacks`` hook timing every collection (per generation: count, total and longest
pause, pauses over 5 ms, the full collections' times) and writes the summary to ``path`` as
JSON on ``SIGUSR1`` and when the process exits; ``SIGUSR2`` resets it. The bench resets it
when py-spy starts and has it written when py-spy ends. Measurement only: nothing in ``api/``
imports it.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

ENV = "LOADTEST_GC_TRACE"


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
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(summary, indent=2) + "\n")
        partial.replace(self.path)  # whole or absent: the bench polls for it


def install(path: str) -> GcTrace:
    trace = GcTrace(Path(path))
    gc.callbacks.append(trace)
    atexit.register(trace.dump)
    signal.signal(signal.SIGUSR1, trace.dump)
    signal.signal(signal.SIGUSR2, trace.reset)
    return trace


def install_from_environment() -> GcTrace | None:
    """``install`` at ``$LOADTEST_GC_TRACE`` when it is set (the bench's ``--profile``)."""
    path = os.environ.get(ENV)
    return install(path) if path else None
