"""A decision is committed before its answer is written: after kill -9, every RRN the
host answered is in its store, as answered."""

from __future__ import annotations

from pathlib import Path

from api.acquirer.host.process import AcquirerProcess
from api.acquirer.host.store import net_approvals, summary
from api.acquirer.messages import Answer
from tests.api.acquirer_host.conftest import Wire, auth_request, start_host


def test_every_answered_rrn_survives_kill_9(tmp_path: Path) -> None:
    proc = start_host(tmp_path)
    wire = Wire(proc.port)
    requests = [auth_request() for _ in range(400)]
    for req in requests:  # all in flight at once on one connection
        wire.authorize(req)
    answered: dict[str, Answer] = {}
    while len(answered) < 100:
        got = wire.answer()
        answered[got.rrn] = got
    proc.kill()
    rows = summary(proc.store)
    for rrn, got in answered.items():
        assert rrn in rows, f"{rrn} was answered but is not in the store"
        assert rows[rrn].approved and rows[rrn].authorization_code == got.authorization_code
    assert set(answered) <= net_approvals(proc.store)
    wire.close()


def test_the_store_is_reopened_after_kill_9_and_remembers(tmp_path: Path) -> None:
    proc = start_host(tmp_path)
    req = auth_request()
    first = Wire(proc.port).call(req)
    proc.kill()
    again = AcquirerProcess(store=proc.store, port=proc.port).start()
    try:
        repeat = Wire(again.port).call(req)
        assert repeat.authorization_code == first.authorization_code
        assert summary(again.store)[req.rrn].requests == 2
    finally:
        again.stop()
