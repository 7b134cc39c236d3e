"""Faults switched at run time through the control socket (and SIGUSR1/SIGUSR2): every
fault after the decision leaves the decision in the store."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from api.acquirer.host.faults import FaultError, control
from api.acquirer.host.process import AcquirerProcess, sign_on
from api.acquirer.host.store import messages, summary
from tests.api.acquirer_host.conftest import Wire, auth_request, start_host
from tests.support.eventually import eventually


def _fates(host: AcquirerProcess, rrn: str) -> list[object]:
    return [m["fate"] for m in messages(host.store, rrn=rrn)]


def test_dropped_answer_is_decided_and_stored_never_answered(
    host: AcquirerProcess, wire: Wire
) -> None:
    host.control(drop_answer=1.0)
    req = auth_request()
    wire.authorize(req)
    assert wire.answers_until_echo() == []
    assert summary(host.store)[req.rrn].approved
    assert _fates(host, req.rrn) == ["answer_dropped"]
    host.control(drop_answer=0.0)
    assert wire.call(req).response_code == "00"  # the original 0210, to a repeat


def test_late_answer_comes_after_later_requests(host: AcquirerProcess, wire: Wire) -> None:
    host.control(late_answer=1.0, late_seconds=0.5)
    late = auth_request()
    wire.authorize(late)
    assert wire.answers_until_echo() == []  # not yet
    host.control(late_answer=0.0)
    assert summary(host.store)[late.rrn].approved  # decided before the delay
    got = wire.answer()
    assert (got.rrn, got.response_code) == (late.rrn, "00")


@pytest.mark.parametrize("when", ["before", "after"])
def test_dropped_connection(host: AcquirerProcess, when: str) -> None:
    host.control(drop_connection=1.0, drop_when=when)
    wire = Wire(host.port)
    req = auth_request()
    wire.authorize(req)
    assert wire.closed_by_host()
    row = summary(host.store)[req.rrn]
    assert row.requests == 1
    if when == "before":
        assert (row.state, _fates(host, req.rrn)) == ("received", ["dropped_before_decision"])
    else:
        assert (row.approved, _fates(host, req.rrn)) == (True, ["connection_dropped"])
    host.control(drop_connection=0.0)
    again = Wire(host.port).call(req)  # a repeat on a new connection: decided once
    assert again.response_code == "00"
    assert summary(host.store)[req.rrn].requests == 2


def test_down_closes_every_connection_and_refuses_new_ones_until_up(
    host: AcquirerProcess, wire: Wire
) -> None:
    wire.call(auth_request())
    state = host.control(down=True)
    assert state["faults"]["down"] is True
    assert wire.closed_by_host()
    with pytest.raises(ConnectionRefusedError):
        Wire(host.port)
    assert host.control()["faults"]["down"] is True
    host.control(down=False)
    assert Wire(host.port).call(auth_request()).response_code == "00"


def test_signals_take_the_host_down_and_up(host: AcquirerProcess, wire: Wire) -> None:
    host.signal(signal.SIGUSR1)
    assert wire.closed_by_host()
    eventually(lambda: host.control()["faults"]["down"], what="down after SIGUSR1")
    assert not sign_on(host.port)
    host.signal(signal.SIGUSR2)
    eventually(lambda: sign_on(host.port), what="up after SIGUSR2")
    assert host.control()["faults"]["down"] is False


def test_latency_and_jitter_are_settable(host: AcquirerProcess, wire: Wire) -> None:
    state = host.control(latency_ms=5, jitter_ms=5)
    assert (state["faults"]["latency_ms"], state["faults"]["jitter_ms"]) == (5.0, 5.0)
    assert wire.call(auth_request()).response_code == "00"


def test_control_refuses_unknown_or_out_of_range_settings(host: AcquirerProcess) -> None:
    with pytest.raises(FaultError, match="unknown"):
        host.control(drop_everything=1.0)
    with pytest.raises(FaultError, match="probability"):
        host.control(drop_answer=1.5)
    with pytest.raises(FaultError, match="drop_when"):
        host.control(drop_when="sometimes")
    assert host.control()["faults"]["drop_answer"] == 0.0


def test_control_client_talks_to_the_socket_directly(host: AcquirerProcess) -> None:
    state = control("127.0.0.1", host.control_port, drop_answer=0.25)
    assert state["ok"] and state["faults"]["drop_answer"] == 0.25
    assert state["port"] == host.port


def test_faults_set_by_flags_at_start(tmp_path: Path) -> None:
    proc = start_host(tmp_path, "--drop-answer", "1.0", "--seed", "3")
    try:
        wire = Wire(proc.port)
        req = auth_request()
        wire.authorize(req)
        assert wire.answers_until_echo() == []
        assert summary(proc.store)[req.rrn].approved
    finally:
        proc.stop()


def test_started_down_accepts_nothing_until_up(tmp_path: Path) -> None:
    proc = start_host(tmp_path, "--down")
    try:
        assert not sign_on(proc.port)
        proc.control(down=False)
        assert sign_on(proc.port)
    finally:
        proc.stop()
