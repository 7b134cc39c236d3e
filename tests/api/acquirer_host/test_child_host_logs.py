"""The server's child acquirer host (``api.acquirer.runtime.ChildHost``) writes its log to a
pipe the server reads: a pipe nobody drained filled after ~64 KiB and blocked the host's
event loop on its next log line — every create then ended declined ``acquirer_timeout``."""

from __future__ import annotations

import socket
from pathlib import Path

from api.acquirer.host.process import sign_on
from api.acquirer.link import parse_acquirer_url
from api.acquirer.runtime import ChildHost


def test_the_child_host_still_answers_after_logging_far_more_than_a_pipe_holds(
    tmp_path: Path,
) -> None:
    child = ChildHost.start(tmp_path / "acquirer.sqlite3", slow_seconds=0.1)
    try:
        host, port = parse_acquirer_url(child.url)
        for _ in range(1500):  # each one a garbage line (~150 bytes) in the host's log
            with socket.create_connection((host, port), timeout=5) as garbage:
                garbage.sendall(b"\x00\x05GARBAGE!")
                garbage.settimeout(5)
                assert garbage.recv(64) == b""  # the host closes a garbage connection
        assert sign_on(port), "the child host stopped answering"
    finally:
        child.stop()
