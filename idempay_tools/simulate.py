"""``idempay simulate``: a terminal fleet on a lossy link through the SDK, then contract §8.

Each terminal is its own ``client_sdk.Client`` with its own journal file and sells
``payments`` cards one after the other (mostly ``tok_visa_*``, a few ``tok_decline_*``,
optionally a share of ``tok_issuer_slow``). The link is either a
``client_sdk.faults.FaultyTransport`` inside each terminal (default) or one shared
``idempay_tools.chaos_proxy.ChaosProxy`` on loopback (``via_proxy``). A loss rate ``P`` splits
into 40 % request drops, 40 % response drops (the server processed it) and 20 % resets.

``kill_clients``: every terminal is a subprocess (``python -m idempay_tools.simulate --terminal``);
a third of them are SIGKILLed mid-run, each then rebooted as a new process on the same
journal that calls ``recover()`` first and sells the payments still owed.

``reboot_terminals`` (``--reboot-terminals``, ``idempay_tools.simulate_reboot``): half the
terminals die once inside a payment — before its create leaves, or after it was answered —
reboot on their journal (``recover()`` first), and the cashier re-runs the interrupted
sale with a new key; ``one_charge_per_sale`` then counts approved charges per sale.

Round trips are counted in the terminal's transport, before any injected fault:
``resends`` are creates with ``Idempotency-Attempt`` ≥ 2. A killed process loses the
counts of the payment it was in (a small undercount, stated).

Through the proxy, its own tally of the creates it lost (``idempay_tools.simulate_links``)
is the ground truth that ``idempay simulate`` and ``idempay demo`` check the audit's link
loss against.

``idempay_tools.simulate_run.run_simulation`` wires it for the CLI: server (a subprocess unless
``--url``), API key, fleet, ``idempay_tools.invariants.check_invariants``, and a rich table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from client_sdk import (
    APIError,
    Client,
    Journal,
    JournalEntry,
    JournalError,
    JournalState,
    OfflineLimitError,
    PaymentAborted,
    PaymentInDoubt,
    RetryPolicy,
)
from client_sdk.faults import FaultyTransport
from idempay_tools.chaos_proxy import ChaosProxy, ProxyThread
from idempay_tools.simulate_links import LinkLedger, LinkLossCheck
from idempay_tools.simulate_outage import (
    OUTAGE_POLICY,
    OUTAGE_START_S,
    OutageLink,
    in_outage,
    stored_left,
)
from idempay_tools.simulate_reboot import run_rebooting, sell_after_reboot

if TYPE_CHECKING:  # the terminal subprocesses import only the SDK side of this module
    from rich.console import Console


__all__ = ["FleetConfig", "FleetResult", "Terminal", "run_fleet"]

VISA = ("4242", "1881", "0077", "5556", "9995")
DECLINES = ("tok_decline_insufficient_funds", "tok_decline_do_not_honor")
RECOVER_PASSES = 3


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """One fleet run. ``payments`` is per terminal; ``loss`` in [0, 1]."""

    base_url: str
    api_key: str
    workdir: Path
    terminals: int = 4
    payments: int = 25
    loss: float = 0.035
    via_proxy: bool = False
    kill_clients: bool = False
    reboot_terminals: bool = False
    seed: int = 1
    decline_share: float = 0.05
    slow_share: float = 0.0
    deadline_s: float = 30.0
    timeout_s: float = 5.0
    base_backoff: float = 0.02
    max_backoff: float = 0.5
    abort_grace_s: float = 15.0
    terminal_prefix: str = "SIM"
    clock_skew_s: float = 0.0  # the terminals' clocks run this far from the true time
    outage_s: float = 0.0  # --outage: the link fully down this long for part of the fleet
    outage_share: float = 0.5  # the part of the fleet that loses its link
    outage_start: float = 0.0  # unix time the outage starts (set by run_fleet)

    def __post_init__(self) -> None:
        if self.terminals < 1 or self.payments < 1:
            raise ValueError("terminals and payments must be >= 1")
        if not 0.0 <= self.loss <= 1.0:
            raise ValueError("loss must be in [0, 1]")
        if self.decline_share + self.slow_share > 1.0:
            raise ValueError("decline_share + slow_share must be <= 1")

    def journal(self, index: int) -> Path:
        return self.workdir / f"{self.terminal_id(index)}.db"

    def terminal_id(self, index: int) -> str:
        return f"{self.terminal_prefix}-{index:04d}"

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "workdir": str(self.workdir)})

    @classmethod
    def from_json(cls, text: str) -> FleetConfig:
        data = json.loads(text)
        return cls(**{**data, "workdir": Path(data["workdir"])})


@dataclass
class FleetResult:
    """What the fleet saw: each payment's outcome as the SDK reported it, round trips,
    injected faults, and the journals to check."""

    outcomes: dict[str, str] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    journals: list[Path] = field(default_factory=list)
    elapsed_s: float = 0.0
    killed: int = 0
    recovered: int = 0
    reruns: int = 0  # sales a cashier re-ran after a reboot
    link: LinkLedger | None = None  # via the proxy: what it did with each key's creates
    merchant_id: str | None = None  # the fleet's merchant (set by the invariant check)
    link_loss: LinkLossCheck | None = None  # the audit's link loss against ``link``
    stored_left: int = 0  # --outage: payments sold offline and never forwarded (must be 0)

    @property
    def payments(self) -> int:
        return len(self.outcomes)

    def tally(self) -> Counter[str]:
        return Counter(self.outcomes.values())

    @property
    def extra_round_trips(self) -> float:
        extra = self.counts["lookups"] + self.counts["resends"]
        return extra / self.payments if self.payments else 0.0


@dataclass(frozen=True, slots=True)
class Sale:
    """What the customer buys; a cashier who re-runs it after a reboot re-runs this."""

    sale_id: str
    amount: int
    card: dict[str, str]


class CountingTransport(httpx.BaseTransport):
    """Counts what the SDK asks for (creates, resends, lookups, aborts, reversals)."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.die: str | None = None  # SIGKILL this process on the next first create

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "POST" and path == "/v1/transactions":
            names = ["creates"]
            if int(request.headers.get("idempotency-attempt", "1")) > 1:
                names.append("resends")
            elif self.die is not None:
                return self._die(request, after=self.die == "after")
        elif request.method == "GET":
            names = ["lookups"]
        elif path.endswith("/abort"):
            names = ["aborts"]
        else:
            names = ["reversals"]
        with self._lock:
            self.counts.update(names)
        response = self.inner.handle_request(request)
        if response.status_code >= 500:
            with self._lock:
                self.counts[f"http_{response.status_code}"] += 1
        return response

    def _die(self, request: httpx.Request, *, after: bool) -> httpx.Response:
        """The terminal dies mid-payment: before the create leaves, or once it has been
        answered (the answer is never read)."""
        if after:
            self.inner.handle_request(request).read()
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.inner.close()


def _seed(config: FleetConfig, index: int, salt: str) -> int:
    return random.Random(f"{config.seed}:{index}:{salt}").getrandbits(32)


def _card(rng: random.Random, config: FleetConfig) -> dict[str, str]:
    roll = rng.random()
    if roll < config.slow_share:
        return {"token": "tok_issuer_slow", "last4": "0002", "brand": "visa"}
    if roll < config.slow_share + config.decline_share:
        return {"token": rng.choice(DECLINES), "last4": "0341", "brand": "visa"}
    last4 = rng.choice(VISA)
    return {"token": f"tok_visa_{last4}", "last4": last4, "brand": "visa"}


def _open_client(
    config: FleetConfig, index: int
) -> tuple[Client, CountingTransport, OutageLink | None]:
    inner: httpx.BaseTransport = httpx.HTTPTransport()
    outage = None
    if config.outage_s and in_outage(config.seed, index, config.terminals, config.outage_share):
        inner = outage = OutageLink(inner, start=config.outage_start, seconds=config.outage_s)
    if not config.via_proxy and config.loss > 0:
        inner = FaultyTransport(
            inner,
            seed=_seed(config, index, "link"),
            drop_request=config.loss * 0.4,
            drop_response=config.loss * 0.4,
            reset=config.loss * 0.2,
        )
    counting = CountingTransport(inner)
    skew = config.clock_skew_s
    client = Client(
        config.base_url,
        config.api_key,
        terminal_id=config.terminal_id(index),
        journal=config.journal(index),
        network="gprs",
        timeout=config.timeout_s,
        transport=counting,
        retry=RetryPolicy(base=config.base_backoff, cap=config.max_backoff),
        abort_grace_s=config.abort_grace_s,
        seed=_seed(config, index, "sdk"),
        clock=(lambda: time.time() + skew) if skew else None,
        offline=OUTAGE_POLICY if config.outage_s else None,
    )
    return client, counting, outage


class Terminal:
    """One POS: its own ``Client``, journal, link and stream of cards."""

    def __init__(self, config: FleetConfig, index: int, *, rebooted: bool = False) -> None:
        self.config = config
        self.client, self._counting, self._outage = _open_client(config, index)
        self._rng = random.Random(_seed(config, index, f"cards:{rebooted}"))
        self._offline: list[str] = []  # keys this terminal sold offline

    @property
    def counts(self) -> Counter[str]:
        return self._counting.counts

    @property
    def faults(self) -> dict[str, int]:
        inner = self._counting.inner
        faults = dict(inner.stats) if isinstance(inner, FaultyTransport) else {}
        if self._outage is not None:
            faults.update(self._outage.stats)
        return faults

    def next_sale(self) -> Sale:
        """The next customer at the till: a sale id (unique, also across reboots, whose
        card streams repeat), an amount and a card."""
        card = _card(self._rng, self.config)
        amount = self._rng.randint(100, 50_000)
        # a canonical UUID is never taken for a card number (hex digit runs can pass Luhn)
        return Sale(f"{self.client.terminal_id}:{uuid.uuid4()}", amount, card)

    def sell(self, sale: Sale | None = None) -> tuple[str, str]:
        """One purchase (``sale``, or the next one): (key, approved | declined | aborted |
        in_doubt | rejected | storage_error | journal_error). The key is "" when the
        payment never reached the journal."""
        sale = sale or self.next_sale()
        journal = self.client.journal
        before = len(journal.entries())
        try:
            result = self.client.purchase(
                amount=sale.amount,
                currency="BRL",
                card=sale.card,
                deadline_s=self.config.deadline_s,
                metadata={"sale_id": sale.sale_id},
            )
        except OfflineLimitError as exc:  # the link was down and the policy said no
            self.counts["offline_refused"] += 1
            return exc.key, "aborted"
        except PaymentAborted as exc:
            return exc.key, "aborted"
        except PaymentInDoubt as exc:
            return exc.key, "in_doubt"
        except APIError:  # refused (a 4xx): journaled RESOLVED; the newest entry is this one
            return self._newest(before), "rejected"
        except JournalError:
            return self._newest(before), "journal_error"
        except sqlite3.Error:  # the journal failed (disk full) and the SDK let it out raw
            return self._newest(before), "storage_error"
        if result.offline:  # stored: forwarded by a later sale or settle()
            self.counts["offline_sales"] += 1
            self._offline.append(result.id)
        return result.id, result.status

    def _newest(self, before: int) -> str:
        """The key of the entry ``sell`` journaled, or "" when it journaled none."""
        try:
            entries = self.client.journal.entries()
        except sqlite3.Error:
            return ""
        return entries[-1].key if len(entries) > before else ""

    def settle(self, *, wait_for_link: bool = True) -> dict[str, str]:
        """recover() what is left in doubt, like the terminal's next boot (bounded); a
        terminal in the outage first waits for its link to come back (unless not
        ``wait_for_link``: a boot in the outage recovers what it can and sells on)."""
        settled: dict[str, str] = {}
        if self._outage is not None and wait_for_link:
            time.sleep(max(0.0, self._outage.start + self._outage.seconds - time.time()))
        for _ in range(RECOVER_PASSES):
            if not self.client.journal.unresolved():
                break
            for item in self.client.recover():
                if item.transaction is not None:
                    settled[item.key] = item.transaction.status
                elif item.state is JournalState.ABORTED:
                    settled[item.key] = "aborted"
                elif item.state is JournalState.RESOLVED:
                    settled[item.key] = "rejected"
                else:
                    settled[item.key] = "in_doubt"
        settled.update(self._forwarded())
        return settled

    def _forwarded(self) -> dict[str, str]:
        """What became of the sales stored offline: the server's status once forwarded
        (an issuer may decline what the terminal accepted), ``refused`` when REPORTED."""
        found: dict[str, str] = {}
        for key in self._offline:
            entry = self.client.journal.get(key)
            if entry is None or entry.state is JournalState.STORED:
                continue  # still owed: the invariants report it
            outcome = entry.outcome or {}
            if entry.state is JournalState.REPORTED:
                found[key] = "refused"
            elif outcome.get("kind") == "transaction" and isinstance(outcome.get("status"), str):
                found[key] = outcome["status"]
        return found

    def close(self) -> None:
        self.client.close()


class _Tally:
    """Collects outcomes from all terminals (thread-safe) and advances the progress bar."""

    def __init__(self, result: FleetResult, advance: Callable[[], None]) -> None:
        self.result = result
        self._advance = advance
        self._lock = threading.Lock()

    def record(self, key: str, status: str) -> None:
        with self._lock:
            new = key not in self.result.outcomes
            self.result.outcomes[key] = status
        if new:
            self._advance()

    def seen(self, key: str) -> bool:
        with self._lock:
            return key in self.result.outcomes

    def merge(
        self, counts: Mapping[str, int], faults: Mapping[str, int], *, recovered: int = 0
    ) -> None:
        with self._lock:
            self.result.counts.update(counts)
            self.result.faults.update(faults)
            self.result.recovered += recovered

    def killed(self) -> None:
        with self._lock:
            self.result.killed += 1

    def rerun(self) -> None:
        with self._lock:
            self.result.reruns += 1


@contextlib.contextmanager
def _link(
    config: FleetConfig, ledger: LinkLedger | None
) -> Iterator[tuple[FleetConfig, ProxyThread | None]]:
    """The fleet's view of the server: direct, or through one shared chaos proxy that
    tells ``ledger`` what it does with each request."""
    if not config.via_proxy:
        yield config, None
        return
    url = httpx.URL(config.base_url)
    proxy = ChaosProxy(
        target_host=url.host,
        target_port=url.port or 80,
        seed=config.seed,
        loss=config.loss,
        drop_request_ratio=0.5,
        reset_ratio=0.2,
        on_request=ledger.observe if ledger is not None else None,
    ).run_in_thread()
    try:
        yield replace(config, base_url=f"http://127.0.0.1:{proxy.port}"), proxy
    finally:
        proxy.stop()


def run_fleet(config: FleetConfig, *, console: Console | None = None) -> FleetResult:
    """Run every terminal to the end; a rich progress bar on ``console`` (stderr)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    config.workdir.mkdir(parents=True, exist_ok=True)
    if config.outage_s and not config.outage_start:
        config = replace(config, outage_start=time.time() + OUTAGE_START_S)
    result = FleetResult(journals=[config.journal(i) for i in range(config.terminals)])
    result.link = LinkLedger() if config.via_proxy else None
    progress = Progress(
        TextColumn("[bold]fleet"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("payments"),
        TimeElapsedColumn(),
        console=console or Console(stderr=True),
    )
    with _link(config, result.link) as (linked, proxy), progress:
        task = progress.add_task("fleet", total=config.terminals * config.payments)
        tally = _Tally(result, lambda: progress.advance(task))
        started = time.perf_counter()
        if config.reboot_terminals:
            run_rebooting(linked, tally, _run_all)
        else:
            runner = _run_processes if config.kill_clients else _run_threads
            runner(linked, tally)
        result.elapsed_s = time.perf_counter() - started
        if proxy is not None:
            result.faults.update(proxy.stats)
    if config.outage_s:
        result.stored_left = stored_left(result.journals)
    return result


def _run_all(target: Callable[[int], None], terminals: int) -> None:
    errors: list[BaseException] = []

    def guarded(index: int) -> None:
        try:
            target(index)
        except BaseException as exc:  # re-raised in the caller's thread after join
            errors.append(exc)

    threads = [
        threading.Thread(target=guarded, args=(i,), name=f"terminal-{i}", daemon=True)
        for i in range(terminals)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _run_threads(config: FleetConfig, tally: _Tally) -> None:
    def sell_all(index: int) -> None:
        with contextlib.closing(Terminal(config, index)) as pos:
            for _ in range(config.payments):
                tally.record(*pos.sell())
            for key, status in pos.settle().items():
                tally.record(key, status)
            tally.merge(pos.counts, pos.faults)

    _run_all(sell_all, config.terminals)


# ------------------------------------------------------------------ --kill-clients
def _victims(config: FleetConfig) -> dict[int, int]:
    """terminal index → payments it completes before it is killed (a third, at least 1)."""
    rng = random.Random(f"{config.seed}:victims")
    chosen = rng.sample(range(config.terminals), max(1, config.terminals // 3))
    return {i: rng.randint(1, max(1, config.payments - 1)) for i in chosen}


def _reported_status(entry: JournalEntry) -> str:
    """What the terminal would have reported for a settled entry (as ``Terminal.settle``)."""
    outcome = dict(entry.outcome or {})
    if outcome.get("kind") == "transaction":
        return str(outcome.get("status"))
    return "aborted" if entry.state is JournalState.ABORTED else "rejected"


def _run_processes(config: FleetConfig, tally: _Tally) -> None:
    victims = _victims(config)
    _run_all(lambda index: _supervise(config, index, tally, victims.get(index)), config.terminals)


def _supervise(config: FleetConfig, index: int, tally: _Tally, kill_after: int | None) -> None:
    """Run terminal ``index`` as a process; a victim is SIGKILLed a few milliseconds after
    its ``kill_after``-th payment (so mostly mid-payment), then rebooted on its journal."""
    _follow(config, index, tally, payments=config.payments, kill_after=kill_after)
    if kill_after is None:
        return
    tally.killed()
    with Journal(config.journal(index)) as journal:
        entries = journal.entries()
    for entry in entries:
        # Settled by the killed process between its journal write and its report line: the
        # reboot's recover() will not report it again (it is settled), so count it here.
        if entry.state.is_terminal and not tally.seen(entry.key):
            tally.record(entry.key, _reported_status(entry))
    started = len(entries)
    _follow(config, index, tally, payments=config.payments - started, reboot=True)


def _follow(
    config: FleetConfig,
    index: int,
    tally: _Tally,
    *,
    payments: int,
    kill_after: int | None = None,
    reboot: bool = False,
) -> None:
    argv = [sys.executable, "-m", "idempay_tools.simulate", "--terminal", str(index)]
    argv += ["--payments", str(payments), "--config", config.to_json()]
    proc = subprocess.Popen(
        argv + (["--reboot"] if reboot else []), stdout=subprocess.PIPE, text=True
    )
    bound = payments * (config.deadline_s + config.abort_grace_s) + 120.0
    watchdog = threading.Timer(bound, proc.kill)  # every payment ends by its own bounds
    watchdog.start()
    assert proc.stdout is not None
    last: dict[str, Any] = {}
    sold = recovered = 0
    killed = False
    try:
        for line in proc.stdout:
            last = json.loads(line)
            if "key" in last:
                recovered += 1 if last.get("boot") else 0
                sold += 0 if last.get("boot") else 1
                tally.record(last["key"], last["status"])
            if kill_after is not None and sold >= kill_after and not killed:
                time.sleep(random.Random(f"{config.seed}:{index}").uniform(0.0, 0.02))
                proc.send_signal(signal.SIGKILL)
                # Keep reading to EOF: a payment the terminal reported just before it died
                # is in the pipe already (its journal entry is settled, so the reboot's
                # recover() will not report it again).
                killed = True
    finally:
        watchdog.cancel()
        proc.stdout.close()
        proc.wait()
    tally.merge(last.get("counts", {}), last.get("faults", {}), recovered=recovered)
    if kill_after is None and proc.returncode != 0:
        raise RuntimeError(f"terminal {index} exited with {proc.returncode}")


def _child(argv: list[str]) -> None:
    """``python -m idempay_tools.simulate --terminal I --payments K --config JSON [--reboot]``: one
    terminal process; a JSON line per payment, with the cumulative counts and faults."""
    parser = argparse.ArgumentParser(prog="python -m idempay_tools.simulate")
    parser.add_argument("--terminal", type=int, required=True)
    parser.add_argument("--payments", type=int, required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--reboot", action="store_true", help="recover() first")
    parser.add_argument("--die-at", type=int, help="die during this payment (1-based)")
    parser.add_argument("--die-kind", choices=("before", "after"), default="before")
    parser.add_argument("--rerun", help="after the reboot, the cashier re-runs this sale")
    parser.add_argument("--rerun-kind", choices=("before", "after"), default="before")
    args = parser.parse_args(argv)
    config = FleetConfig.from_json(args.config)
    with contextlib.closing(Terminal(config, args.terminal, rebooted=args.reboot)) as pos:

        def emit(message: dict[str, Any]) -> None:
            totals = {"counts": dict(pos.counts), "faults": pos.faults}
            sys.stdout.write(json.dumps({**message, **totals}) + "\n")
            sys.stdout.flush()

        if args.reboot:
            settled = pos.settle()
            for key, status in settled.items():
                emit({"key": key, "status": status, "boot": True})
            if args.rerun:
                sale = Sale(**json.loads(args.rerun))
                sell_after_reboot(pos, settled, sale, args.rerun_kind, emit)
        for number in range(1, args.payments + 1):
            sale = pos.next_sale()
            if number == args.die_at:
                emit({"sale": asdict(sale)})
                pos._counting.die = args.die_kind
            key, status = pos.sell(sale)
            emit({"key": key, "status": status})
        for key, status in pos.settle().items():
            emit({"key": key, "status": status})
        emit({"done": True})


if __name__ == "__main__":
    _child(sys.argv[1:])
