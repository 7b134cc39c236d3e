"""``python -m loadtest.bench --profile``'s reading of what it sampled: py-spy's collapsed
stacks filed by layer, and the server's GC trace (no server, no py-spy: their outputs as
the bench reads them)."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

from rich.console import Console

from loadtest import _bench_profile as profiling
from loadtest._bench_layers import LAYERS, layer_of
from loadtest._bench_report import render_profile
from loadtest._gc_trace import GcTrace

SITE = "/work/main/.venv/lib/python3.11/site-packages"
ROOT = f"Runner.run ({SITE}/../../asyncio/runners.py:118);run (uvicorn/server.py:68)"


def _stack(*frames: str, count: int) -> str:
    return ";".join([ROOT, *frames]) + f" {count}"


RAW = "\n".join(
    [
        _stack(
            "create (/work/main/api/transactions/lean.py:80)",
            "create (/work/main/api/transactions/service.py:200)",
            "render (/work/main/api/transactions/repository.py:71)",
            "dumps (/usr/lib/python3.11/json/__init__.py:231)",
            count=5,
        ),
        _stack(
            "create (/work/main/api/transactions/service.py:200)",
            "insert_transaction (/work/main/api/transactions/repository.py:110)",
            f"execute ({SITE}/sqlalchemy/ext/asyncio/engine.py:650)",
            count=7,
        ),
        _stack(
            "create (/work/main/api/transactions/acquire.py:90)",
            "authorize (/work/main/api/acquirer/link.py:300)",
            f"pack ({SITE}/iso8583/encoder.py:40)",
            count=3,
        ),
        _stack(
            "flush (/work/main/api/events/writer.py:120)",
            f"execute ({SITE}/sqlalchemy/engine/base.py:1400)",
            count=2,
        ),
        _stack(
            "decode (/work/main/api/transactions/http.py:110)",
            f"validate_json ({SITE}/pydantic/main.py:600)",
            count=4,
        ),
        "Runner.run (/usr/lib/python3.11/asyncio/runners.py:118) 6",
        "not a stack line",
    ]
)


def test_each_sample_lands_in_one_layer_of_the_request_path() -> None:
    profile = profiling.parse(RAW)
    assert profile.samples == 27
    assert dict(profile.layers) == {
        "service": 5,  # json.dumps under repository.render
        "SQL": 7,  # SQLAlchemy under the transaction insert
        "acquirer link": 3,  # pyiso8583 under the link
        "request events": 2,  # any frame of api/events/ decides first
        "validation": 4,  # pydantic under the body's decode
        "event loop / other": 6,  # uvloop's native time: only the loop's own frame
    }
    assert set(profile.layers) <= set(LAYERS)


def test_a_stack_with_no_known_frame_is_the_event_loop() -> None:
    assert layer_of([]) == "event loop / other"
    assert layer_of(["run (stdlib/selectors.py)"]) == "event loop / other"
    assert layer_of(["dispatch (api/transactions/router.py)"]) == "ASGI/HTTP"


def test_the_gc_trace_counts_each_collection_and_writes_a_whole_summary(tmp_path: Path) -> None:
    path = tmp_path / "create.gc.json"
    trace = GcTrace(path)
    trace("start", {"generation": 0})
    trace("stop", {"generation": 0, "collected": 3})
    trace("start", {"generation": 2})
    trace("stop", {"generation": 2, "collected": 10})
    trace.dump()
    summary = profiling.read_gc_trace(path, timeout_s=1.0)
    assert summary is not None
    assert summary["generations"]["0"]["count"] == 1
    assert summary["generations"]["0"]["collected"] == 3
    assert summary["generations"]["2"]["count"] == 1
    assert len(summary["full"]) == 1
    assert not path.with_name(path.name + ".partial").exists()
    trace.reset()
    trace.dump()
    after_reset = json.loads(path.read_text())
    assert all(row["count"] == 0 for row in after_reset["generations"].values())
    assert after_reset["full"] == []


def test_no_gc_summary_is_none_not_a_wait_for_ever(tmp_path: Path) -> None:
    assert profiling.read_gc_trace(tmp_path / "absent.json", timeout_s=0.2) is None


def test_the_profile_report_shows_layers_cpu_and_gc_pauses(tmp_path: Path) -> None:
    profile = profiling.parse(RAW)
    profile.cpu_us_per_create = 1000.0
    trace = GcTrace(tmp_path / "gc.json")
    trace("start", {"generation": 1})
    trace("stop", {"generation": 1})
    trace.dump()
    profile.gc = profiling.read_gc_trace(tmp_path / "gc.json", timeout_s=1.0)
    out = StringIO()
    render_profile(Console(file=out, width=200), profile)
    text = out.getvalue()
    assert "server CPU 1,000 µs per create under py-spy" in text
    assert "acquirer link" in text
    assert "259" in text  # SQL: 7 of 27 samples of 1,000 µs
    assert "GC pauses in the server" in text
