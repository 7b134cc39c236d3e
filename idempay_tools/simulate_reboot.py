"""``idempay simulate --reboot-terminals``: terminals that die mid-payment, reboot on their
journal, and a cashier who re-runs the sale (issue 24).

Every terminal is a process (``python -m idempay_tools.simulate``). Half of them (at least one)
die once, during a chosen payment, at a chosen point — the process SIGKILLs itself from
inside its HTTP transport, so the point is exact:

- ``before``: the journal has the payment, nothing has left the terminal (the first
  create is about to be sent). The terminal showed nothing; the app, like the one in
  issue 24, runs ``recover()`` at boot without showing its results, so the cashier re-runs
  the sale with a new key. contract §4: ``recover()`` never sells, so the old key is fenced
  and the customer pays once.
- ``after``: the create reached the server and its answer is thrown away. The boot
  screen shows what ``recover()`` found for the interrupted payment; the cashier re-runs
  the sale only when it says the customer was not charged (aborted, declined, refused).

Then the rebooted terminal sells the sales still owed. Each payment carries its sale in
``metadata.sale_id``; ``idempay_tools.invariants`` counts approved transactions per sale
(``one_charge_per_sale``): no customer charged twice for one sale.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from client_sdk import JournalState

if TYPE_CHECKING:
    from idempay_tools.simulate import FleetConfig, Sale, Terminal, _Tally

__all__ = ["KINDS", "reboot_plan", "run_rebooting", "sell_after_reboot"]

KINDS = ("before", "after")
NOT_CHARGED = frozenset({"aborted", "declined", "rejected"})


def reboot_plan(config: FleetConfig) -> dict[int, tuple[int, str]]:
    """terminal index → (the payment, 1-based, it dies in; before | after the send)."""
    rng = random.Random(f"{config.seed}:reboots")
    chosen = sorted(rng.sample(range(config.terminals), max(1, config.terminals // 2)))
    return {i: (rng.randint(1, config.payments), KINDS[n % 2]) for n, i in enumerate(chosen)}


def run_rebooting(config: FleetConfig, tally: _Tally, run_all: Callable[..., None]) -> None:
    plan = reboot_plan(config)
    run_all(lambda index: _supervise(config, index, tally, plan.get(index)), config.terminals)


def _supervise(
    config: FleetConfig, index: int, tally: _Tally, dies: tuple[int, str] | None
) -> None:
    args = ["--payments", str(config.payments)]
    if dies is not None:
        args += ["--die-at", str(dies[0]), "--die-kind", dies[1]]
    code, sale = _follow(config, index, tally, args)
    if dies is None or code != -signal.SIGKILL:
        if code != 0:
            raise RuntimeError(f"terminal {index} exited with {code}")
        return
    tally.killed()
    after = ["--payments", str(config.payments - dies[0]), "--reboot"]
    after += ["--rerun", json.dumps(sale), "--rerun-kind", dies[1]]
    code, _ = _follow(config, index, tally, after)
    if code != 0:
        raise RuntimeError(f"terminal {index} exited with {code} after its reboot")


def _follow(
    config: FleetConfig, index: int, tally: _Tally, args: list[str]
) -> tuple[int, dict[str, Any]]:
    """Run one terminal process to its end; (exit code, the last sale it started)."""
    argv = [sys.executable, "-m", "idempay_tools.simulate", "--terminal", str(index)]
    proc = subprocess.Popen(
        [*argv, "--config", config.to_json(), *args], stdout=subprocess.PIPE, text=True
    )
    bound = config.payments * (config.deadline_s + config.abort_grace_s) + 120.0
    watchdog = threading.Timer(bound, proc.kill)
    watchdog.start()
    assert proc.stdout is not None
    last: dict[str, Any] = {}
    sale: dict[str, Any] = {}
    recovered = 0
    try:
        for line in proc.stdout:
            last = json.loads(line)
            if "sale" in last:
                sale = last["sale"]
            if "key" in last and last["key"]:
                recovered += 1 if last.get("boot") else 0
                tally.record(last["key"], last["status"])
            if last.get("rerun"):
                tally.rerun()
    finally:
        watchdog.cancel()
        proc.stdout.close()
        proc.wait()
    tally.merge(last.get("counts", {}), last.get("faults", {}), recovered=recovered)
    return proc.returncode, sale


def sell_after_reboot(
    pos: Terminal,
    settled: dict[str, str],
    rerun: Sale,
    kind: str,
    emit: Callable[[dict[str, Any]], None],
) -> None:
    """The cashier at the rebooted terminal: re-run the interrupted sale (new key, same
    sale) — blind after a ``before`` death, on the boot screen's word after ``after``."""
    interrupted = next(
        (e for e in pos.client.journal.entries() if _sale_of(e.request) == rerun.sale_id), None
    )
    shown = None
    if interrupted is not None:
        shown = settled.get(interrupted.key) or _journal_status(interrupted.state)
    if kind == "before" or shown is None or shown in NOT_CHARGED:
        key, status = pos.sell(rerun)
        emit({"key": key, "status": status, "rerun": True, "shown": shown})


def _sale_of(request: dict[str, Any]) -> str | None:
    metadata = request.get("metadata") or {}
    return metadata.get("sale_id") if isinstance(metadata, dict) else None


def _journal_status(state: JournalState) -> str | None:
    return "aborted" if state is JournalState.ABORTED else None


def sale_json(sale: Sale) -> dict[str, Any]:
    return asdict(sale)
