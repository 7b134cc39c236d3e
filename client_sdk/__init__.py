"""idempay terminal SDK: exactly-once card payments over unreliable links.

```python
from client_sdk import Client, RetryPolicy
with Client(base_url, api_key, terminal_id="T-0001", journal="pos.db") as pos:
    pos.recover()  # on boot: settle whatever a previous run left in doubt
    result = pos.purchase(amount=1250, currency="BRL", card=card, deadline_s=60)
```

Depends only on the standard library and httpx. ``client_sdk.faults`` holds the
fault-injecting transport used by tests and the fleet simulator.

Deprecated for one release: the error names without the ``Error`` suffix
(``PaymentAborted``, ``PaymentInDoubt``, ``NotFound``, … — aliases of the same classes,
listed in ``client_sdk._exceptions``) and the ``base_backoff`` / ``max_backoff`` /
``max_retries`` arguments of ``Client`` and ``AsyncClient`` (pass ``retry=RetryPolicy(...)``).
"""

from ._client import AsyncClient, Client
from ._exceptions import (
    AdviceTooOldError,
    APIConnectionError,
    APIError,
    ClockSkewError,
    DuplicateGuardError,
    IdempayError,
    IdempotencyKeyInvalid,
    IdempotencyKeyInvalidError,
    IdempotencyKeyMissing,
    IdempotencyKeyMissingError,
    IdempotencyKeyReused,
    IdempotencyKeyReusedError,
    InvalidTransition,
    InvalidTransitionError,
    JournalError,
    NotFound,
    NotFoundError,
    NotReversible,
    NotReversibleError,
    OfflineLimitError,
    PanNotAllowed,
    PanNotAllowedError,
    PayloadTooLarge,
    PayloadTooLargeError,
    PaymentAborted,
    PaymentAbortedError,
    PaymentInDoubt,
    PaymentInDoubtError,
    RateLimited,
    RateLimitedError,
    RequestExpired,
    RequestExpiredError,
    RequestInProgress,
    RequestInProgressError,
    RequestTimeoutError,
    ServerError,
    ServiceUnavailable,
    ServiceUnavailableError,
    StoredPaymentError,
    StoredPaymentOverdueError,
    SuspectedDuplicateError,
    TransactionAborted,
    TransactionAbortedError,
    Unauthorized,
    UnauthorizedError,
    ValidationFailed,
    ValidationFailedError,
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
from ._offline import OfflineExposure, OfflinePolicy
from ._retry import RetryPolicy

__all__ = [
    "APIConnectionError",
    "APIError",
    "AdviceTooOldError",
    "AsyncClient",
    "Card",
    "CardSummary",
    "Client",
    "ClockSkewError",
    "DuplicateGuardError",
    "Fenced",
    "IdempayError",
    "IdempotencyKeyInvalid",
    "IdempotencyKeyInvalidError",
    "IdempotencyKeyMissing",
    "IdempotencyKeyMissingError",
    "IdempotencyKeyReused",
    "IdempotencyKeyReusedError",
    "InvalidTransition",
    "InvalidTransitionError",
    "Journal",
    "JournalEntry",
    "JournalError",
    "JournalState",
    "NotFound",
    "NotFoundError",
    "NotReversible",
    "NotReversibleError",
    "OfflineExposure",
    "OfflineLimitError",
    "OfflinePolicy",
    "PanNotAllowed",
    "PanNotAllowedError",
    "PayloadTooLarge",
    "PayloadTooLargeError",
    "PaymentAborted",
    "PaymentAbortedError",
    "PaymentInDoubt",
    "PaymentInDoubtError",
    "Processing",
    "RateLimited",
    "RateLimitedError",
    "Recovered",
    "RequestExpired",
    "RequestExpiredError",
    "RequestInProgress",
    "RequestInProgressError",
    "RequestTimeoutError",
    "RetryPolicy",
    "ServerError",
    "ServiceUnavailable",
    "ServiceUnavailableError",
    "StoredPaymentError",
    "StoredPaymentOverdueError",
    "SuspectedDuplicateError",
    "Transaction",
    "TransactionAborted",
    "TransactionAbortedError",
    "TransactionStatus",
    "Unauthorized",
    "UnauthorizedError",
    "ValidationFailed",
    "ValidationFailedError",
    "uuid7",
]
