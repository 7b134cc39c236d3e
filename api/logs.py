"""structlog configuration: JSON lines to stdout; never a body, card token or API key.

Every record is one line: structlog's JSON renderer escapes control characters, so no value
(an Idempotency-Key, a path, a header) can forge a record. Records from the standard library
(uvicorn's own warnings and errors, asyncio, Python warnings) go through the same renderer.
A last processor redacts what must never be written even if a bug logged it — a bearer
credential, an ``idp_`` API key, a ``tok_`` card token, a PAN-looking digit run (e.g. in a
SQL error's parameters or a client-chosen X-Request-Id); see docs/security.md.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

from api.config import Settings
from api.pan import redact_pans

_SECRETS = (
    (re.compile(r"(?i)\bbearer\s+[^\s\"',]+"), "Bearer [redacted]"),
    (re.compile(r"\bidp_[A-Za-z0-9_\-]{8,}"), "idp_[redacted]"),
    (re.compile(r"\btok_[A-Za-z0-9_]+"), "tok_[redacted]"),
)
# Identifiers whose random digit runs would look like a PAN about 0.35% of the time: the
# idempotency key (a canonical UUID) and generated request ids (32 hex digits).
_IDENTIFIER = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}", re.I
)
STDLIB_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "py.warnings")


def redact(text: str) -> str:
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    if _IDENTIFIER.fullmatch(text):
        return text
    return redact_pans(text)


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_value(v) for v in value]
    return value


def redact_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: the last line of defence before a record is rendered."""
    for name, value in event_dict.items():
        event_dict[name] = _redact_value(value)
    return event_dict


class _Current:
    """``sys.stdout`` / ``sys.stderr`` as they are when a record is written, not as they were
    when logging was configured: a host that swaps the stream (pytest's capture, a daemon
    redirecting its output) would otherwise leave every cached logger writing to a closed
    file."""

    def __init__(self, name: str) -> None:
        self._name = name

    def write(self, text: str) -> int:
        return getattr(sys, self._name).write(text)  # type: ignore[no-any-return]

    def flush(self) -> None:
        getattr(sys, self._name).flush()


def configure_logging(settings: Settings, *, stream: TextIO | None = None) -> None:
    """``stream``: where the records go — stdout for the servers (default), stderr for an
    operator's command whose stdout is its answer."""
    out: Any = stream
    if stream is None or stream is sys.stdout:
        out = _Current("stdout")
    elif stream is sys.stderr:
        out = _Current("stderr")
    level = logging.getLevelNamesMapping().get(settings.log_level.upper(), logging.INFO)
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if settings.log_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )
    _route_stdlib_logging(renderer, out)


def _route_stdlib_logging(renderer: structlog.types.Processor, stream: Any) -> None:
    """uvicorn configures its loggers with plain-text handlers before it builds the app;
    replace them so the server's output stays one JSON record per line."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.contextvars.merge_contextvars,
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                redact_secrets,
                renderer,
            ],
        )
    )
    for name in STDLIB_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False
    logging.captureWarnings(True)
    root = logging.getLogger()
    if not root.handlers:  # keep a host's handlers (e.g. pytest's) when there are some
        root.addHandler(handler)
