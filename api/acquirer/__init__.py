"""The acquirer link: ISO 8583 over TCP to the acquirer host (SPEC §2.9).

``spec`` (the message specification), ``framing`` (2-byte length prefix), ``messages``
(build and read each message) and ``link`` (the connection pool the create pipeline
calls). The exception tree is drawn in :mod:`api.acquirer.types`.
"""

from api.acquirer.link import AcquirerLink, parse_acquirer_url
from api.acquirer.spec import UnsupportedCurrency
from api.acquirer.types import (
    AcquirerError,
    Authorization,
    AuthorizationRequest,
    InDoubt,
    NeverSent,
    ReversalRequest,
)

__all__ = [
    "AcquirerError",
    "AcquirerLink",
    "Authorization",
    "AuthorizationRequest",
    "InDoubt",
    "NeverSent",
    "ReversalRequest",
    "UnsupportedCurrency",
    "parse_acquirer_url",
]
