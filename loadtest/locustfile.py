"""Locust scenarios of a terminal fleet against idempay (contract §1 "Load tests").

    IDEMPAY_API_KEY=... locust -f loadtest/locustfile.py --headless -u 50 -r 10 \
        --run-time 60s --host http://127.0.0.1:8001 LossyTerminal SdkTerminal

Pick scenarios by naming their user classes on the command line (all four when none):
``LossyTerminal``, ``SdkTerminal``, ``DuplicateStorm``, ``InDoubtStorm`` (see
``loadtest/scenarios``). Loopback hosts only; always pass a bounded ``--run-time``.

Thresholds decide the exit code: 1 when more than 1 % of requests failed or the p99
exceeds ``IDEMPAY_LT_MAX_P99_MS`` (default 2000 ms), else 0. ``python -m
loadtest.run_loadtest`` (``make loadtest``) runs it against a private server behind the
chaos proxy and checks the database invariants afterwards.
"""

from __future__ import annotations

import logging
import os
from typing import Any
from urllib.parse import urlsplit

import gevent
from locust import events

from idempay_tools.chaos_proxy import is_loopback
from loadtest.scenarios import DuplicateStorm, InDoubtStorm, LossyTerminal, SdkTerminal

__all__ = ["DuplicateStorm", "InDoubtStorm", "LossyTerminal", "SdkTerminal"]

MAX_FAIL_RATIO = 0.01
log = logging.getLogger("loadtest.locustfile")


@events.init.add_listener
def _fresh_loop_clock(**_: Any) -> None:
    """The gevent hub caches its clock; importing the scenarios (the SDK, the API models)
    blocks long enough that ``--run-time`` would otherwise fire seconds early."""
    gevent.get_hub().loop.update_now()


@events.init.add_listener
def _loopback_only(environment: Any, **_: Any) -> None:
    host = environment.host or ""
    if host and not is_loopback(urlsplit(host).hostname or ""):
        raise SystemExit(f"refusing non-loopback host {host!r}")


@events.quitting.add_listener
def _thresholds(environment: Any, **_: Any) -> None:
    total = environment.stats.total
    max_p99 = float(os.environ.get("IDEMPAY_LT_MAX_P99_MS", "2000"))
    p99 = total.get_response_time_percentile(0.99) or 0.0
    if total.num_requests == 0:
        log.error("threshold: no requests were made")
        environment.process_exit_code = 1
    elif total.fail_ratio > MAX_FAIL_RATIO:
        log.error("threshold: fail ratio %.2f%% > 1%%", total.fail_ratio * 100)
        environment.process_exit_code = 1
    elif p99 > max_p99:
        log.error("threshold: p99 %.0f ms > %.0f ms", p99, max_p99)
        environment.process_exit_code = 1
    else:
        environment.process_exit_code = 0
