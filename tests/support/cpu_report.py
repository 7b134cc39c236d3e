"""The CPU each test costs, beside its wall time: ``--durations`` says which tests are slow,
this says which are heavy. On the 2-core machine CI runs on the suite is CPU-bound (both
cores busy throughout), so a test's CPU, not its wall time, is what it takes from the run.

Counted per test (setup, call and teardown): the pytest process's own CPU and that of the
child processes it started and reaped meanwhile (servers, CLIs, spark-submit and its JVM,
pan): ``getrusage`` of ``RUSAGE_SELF`` and ``RUSAGE_CHILDREN``, user + system. Not counted:
the machine's shared PostgreSQL and Redis, and a child still running when the test ends: it
is counted in the test during which it is reaped (a session-scoped cluster in the test that
stops it; a process whose handle was dropped unreaped in whichever later test collects it —
so a small test high in the list is carrying another's processes). Under
pytest-xdist each worker measures its own tests and the figure travels on the report.

The summary prints the ``--cpu-top`` heaviest tests (default 25, 0: none) and the total.
"""

from __future__ import annotations

import resource
from collections import defaultdict
from collections.abc import Generator, Iterator
from typing import Any

import pytest

_PHASES = pytest.StashKey[dict[str, float]]()


def _cpu_s() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-top",
        type=int,
        default=25,
        metavar="N",
        help="print the N tests that cost the most CPU, with their children (0: none)",
    )


def _measure(item: pytest.Item, when: str) -> Iterator[None]:
    before = _cpu_s()
    yield
    item.stash.setdefault(_PHASES, {})[when] = _cpu_s() - before


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _measure(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _measure(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _measure(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    # an attribute of the report's own: pytest-xdist carries it to the controller
    report.cpu_s = item.stash.get(_PHASES, {}).get(call.when, 0.0)


class _Totals:
    def __init__(self) -> None:
        self.by_test: dict[str, float] = defaultdict(float)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.by_test[report.nodeid] += float(getattr(report, "cpu_s", 0.0))

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        top = terminalreporter.config.getoption("cpu_top")
        if top <= 0 or not self.by_test:
            return
        total = sum(self.by_test.values())
        heaviest = sorted(self.by_test.items(), key=lambda item: item[1], reverse=True)[:top]
        terminalreporter.write_sep("=", f"heaviest {len(heaviest)} tests by CPU")
        for nodeid, cpu in heaviest:
            terminalreporter.write_line(f"{cpu:8.1f}s cpu  {100 * cpu / total:4.1f} %  {nodeid}")
        terminalreporter.write_line(
            f"{total:8.1f}s cpu in all, {len(self.by_test)} tests"
            " (test processes and the children they reaped; not the shared databases)"
        )


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        config.pluginmanager.register(_Totals(), "idempay-cpu-totals")
