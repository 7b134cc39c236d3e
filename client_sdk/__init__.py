"""idempay terminal SDK: exactly-once card payments over unreliable links.

```python
from client_sdk import Client
with Client(base_url, api_key, terminal_id="T-0001", journal="pos.db") as pos:
    pos.recover()  # on boot: settle whatever a previous run left in doubt
    result = pos.purchase(amount=1250, currency="BRL", card=card, deadline_s=60)
```

Depends only on the standard library and httpx. ``client_sdk.faults`` holds the
fault-injecting transports used by tests and the fleet simulator.
"""

from ._client import AsyncClient, Client
from ._exceptions import (
    APIConnectionError,
    APIError,
    IdempayError,
    IdempotencyKeyInvalid,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    InvalidTransition,
    JournalError,
    NotFound,
    NotReversible,
    PanNotAllowed,
    PayloadTooLarge,
    PaymentAborted,
    PaymentInDoubt,
    RateLimited,
    RequestExpired,
    RequestInProgress,
    ServerError,
    ServiceUnavailable,
    TransactionAborted,
    Unauthorized,
    ValidationFailed,
)
from ._journal import Journal, JournalEntry
from ._keys import uuid7
from ._models import (
    Card,
    CardSummary,
    Fenced,
    JournalState,
    Processing,
    Recovered,
    Transaction,
    TransactionStatus,
)

__all__ = [
    "APIConnectionError",
    "APIError",
    "AsyncClient",
    "Card",
    "CardSummary",
    "Client",
    "Fenced",
    "IdempayError",
    "IdempotencyKeyInvalid",
    "IdempotencyKeyMissing",
    "IdempotencyKeyReused",
    "InvalidTransition",
    "Journal",
    "JournalEntry",
    "JournalError",
    "JournalState",
    "NotFound",
    "NotReversible",
    "PanNotAllowed",
    "PayloadTooLarge",
    "PaymentAborted",
    "PaymentInDoubt",
    "Processing",
    "RateLimited",
    "Recovered",
    "RequestExpired",
    "RequestInProgress",
    "ServerError",
    "ServiceUnavailable",
    "Transaction",
    "TransactionAborted",
    "TransactionStatus",
    "Unauthorized",
    "ValidationFailed",
    "uuid7",
]
