"""A private Redis whose port another process took between choosing it and starting is never
mistaken for its own: ``PrivateRedis.start`` accepts only an answer naming its own process id
(``INFO server``) and chooses another port when its server could not bind. Before, a ping
answered by the other Redis counted as started, and two tests shared one Redis (an epoch
marker one of them wrote or removed was read by the other)."""

from __future__ import annotations

from pathlib import Path

from idempay_tools.private_services import PrivateRedis


def test_a_taken_port_is_not_taken_for_ours(tmp_path: Path) -> None:
    first = PrivateRedis(tmp_path / "first").start()
    second = PrivateRedis(tmp_path / "second")
    second.port = first.port  # taken by the first since it was chosen
    try:
        second.start()
        assert second.port != first.port
        assert second.proc is not None and second._answering_pid() == second.proc.pid
        assert first.proc is not None and first._answering_pid() == first.proc.pid
    finally:
        second.kill()
        first.kill()
