"""Profile the server with py-spy while creates run, and rank frames by self time.

``py-spy record -f raw`` writes collapsed stacks (``frame;frame;… count``, root first,
each frame ``function (path:line)``); idle frames are left out by py-spy, so every sample
is the server's Python thread on the CPU. Self time belongs to a stack's last frame;
inclusive time to every distinct frame of a stack. Frames are grouped by function and
file (line numbers dropped), by package for a coarser split, and by layer of the request
path (``_bench_layers``); SQLAlchemy's share is split further by what it was doing.

SQLAlchemy's async engine runs its sync core in greenlets, and py-spy shows a greenlet's
stack without the coroutine that awaits it: statements executed through ``AsyncConnection``
appear as stacks rooted at ``Connection.execute``, not under the idempay function that
issued them. Inclusive time of ``api/`` functions is therefore a lower bound; self time
and the package split are exact.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest._bench_layers import layer_of

_FRAME = re.compile(r"^(?P<function>\S+) \((?P<path>.*?)(?::(?P<line>\d+))?\)$")
NATIVE = "(no Python frame: native code — uvloop, asyncpg's protocol, greenlet)"
_SITE = re.compile(r".*/site-packages/")
_STDLIB = re.compile(r".*/lib/python3\.\d+/")


def find() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def start(
    py_spy: str, pid: int, seconds: int, out: Path, *, rate: int = 200
) -> subprocess.Popen[str]:
    command = [py_spy, "record", "-d", str(seconds), "-r", str(rate), "-f", "raw"]
    return subprocess.Popen(
        [*command, "-o", str(out), "-p", str(pid)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def short_path(path: str) -> str:
    if "/site-packages/" in path:
        return _SITE.sub("", path)
    if "/work/" in path or path.startswith(("api/", "loadtest/")):
        return path.split("/main/", 1)[-1]
    return "stdlib/" + _STDLIB.sub("", path) if _STDLIB.match(path) else path


def package(path: str) -> str:
    if path.startswith("<sqlalchemy"):  # SQLAlchemy's generated wrappers
        return "sqlalchemy"
    short = short_path(path)
    if short.startswith("stdlib/"):
        return "stdlib:" + short.split("/")[1].removesuffix(".py")
    return short.split("/")[0].removesuffix(".py")


def _frame(raw: str) -> tuple[str, str]:
    """(``function (short/path.py)``, package) of one collapsed frame."""
    match = _FRAME.match(raw.strip())
    if match is None:
        return raw.strip(), "?"
    path = match["path"]
    return f"{match['function']} ({short_path(path)})", package(path)


# Where SQLAlchemy's own time goes, decided by the first marker found in the stack.
_SQLALCHEMY_PHASES = (
    ("cache key of each statement", ("cache_key.py", "_gen_cache_key", "_static_cache_key")),
    ("compiled-statement cache lookup", ("_compile_w_cache", "compiler.py:")),
    ("connection pool", ("sqlalchemy/pool/",)),
    (
        "execution context, parameters, results",
        ("engine/default.py", "engine/cursor.py", "engine/result.py", "engine/row.py"),
    ),
    (
        "building statements (insert().values(), where)",
        (
            "coercions.py",
            "dml.py",
            "_generative",
            "BindParameter.__init__",
            "selectable.py",
            "default_comparator.py",
            "operators.py",
        ),
    ),
    ("async adaptation (greenlet, asyncpg adapter)", ("greenlet", "dialects/postgresql/asyncpg")),
)


def sqlalchemy_phase(stack: str) -> str:
    for phase, markers in _SQLALCHEMY_PHASES:
        if any(marker in stack for marker in markers):
            return phase
    return "other"


@dataclass(slots=True)
class Profile:
    samples: int = 0
    self_time: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    packages: Counter[str] = field(default_factory=Counter)
    sqlalchemy: Counter[str] = field(default_factory=Counter)
    layers: Counter[str] = field(default_factory=Counter)
    cpu_us_per_create: float | None = None  # the server's CPU in py-spy's window
    gc: dict[str, Any] | None = None  # loadtest/_gc_trace.py's summary of the same window

    def top(self, counter: Counter[str], n: int) -> list[tuple[str, int, float]]:
        total = self.samples or 1
        return [(name, count, 100.0 * count / total) for name, count in counter.most_common(n)]


def parse(text: str) -> Profile:
    profile = Profile()
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame(raw) for raw in stack.split(";") if raw.strip()] or [(NATIVE, "native")]
        profile.samples += count
        leaf, leaf_package = frames[-1]
        profile.self_time[leaf] += count
        profile.packages[leaf_package] += count
        if leaf_package == "sqlalchemy":
            profile.sqlalchemy[sqlalchemy_phase(stack)] += count
        for name in {name for name, _ in frames}:
            profile.inclusive[name] += count
        profile.layers[layer_of([name for name, _ in frames])] += count
    return profile


def read_gc_trace(path: Path, *, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """The GC summary the server writes on SIGUSR1 (``_gc_trace``: whole or absent)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            summary: dict[str, Any] = json.loads(path.read_text())
            return summary
        time.sleep(0.1)
    return None
