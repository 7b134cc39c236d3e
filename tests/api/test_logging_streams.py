"""Logging follows the process's current stdout/stderr: a logger configured while another
stream was in place (an embedding host's, pytest's capture) never writes to a closed file."""

from __future__ import annotations

import io
import sys

import pytest
import structlog

from api.config import Settings
from api.logs import configure_logging


@pytest.mark.parametrize("name", ["stdout", "stderr"])
def test_a_swapped_and_closed_stream_is_not_written_to(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = io.StringIO()
    monkeypatch.setattr(sys, name, first)
    configure_logging(Settings(log_json=True), stream=getattr(sys, name))
    log = structlog.get_logger("test")
    log.info("first_record")
    first.close()  # the stream logging was configured with is gone
    second = io.StringIO()
    monkeypatch.setattr(sys, name, second)
    log.info("second_record")
    assert "second_record" in second.getvalue()
